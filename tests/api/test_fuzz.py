"""Schemathesis over the server's whole OpenAPI document, against a real
server process: no 5xx, every response matches its schema and documented
status codes, and data the schema forbids is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.cluster import LocalCluster
from tests.conftest import REPO

CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
        "unsupported_method",
    )
)


@pytest.mark.e2e
def test_schemathesis_finds_no_server_error_and_no_schema_violation(tmp_path: Path) -> None:
    # No workers: every job stays queued, and polls must not be held open.
    cluster = LocalCluster(
        state_dir=tmp_path / "cluster",
        data_dir=tmp_path,
        workers=0,
        # Inputs, not callers: the auth matrix (test_auth.py) tests those.
        secure=False,
        server_env={"DDPO_POLL_WAIT_S": "0", "DDPO_ARTIFACTS_DIR": str(tmp_path / "artifacts")},
    )
    try:
        cluster.start()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "run",
                f"{cluster.url}/openapi.json",
                "--checks",
                CHECKS,
                "--max-examples",
                os.environ.get("DDPO_FUZZ_EXAMPLES", "25"),
                "--workers",
                "2",
                "--request-timeout",
                "10",
                "--seed",
                "20261130",
                "--no-color",
            ],
            env={
                **os.environ,
                "PYTHONPATH": str(REPO),
                "SCHEMATHESIS_HOOKS": "tests.api.fuzz_hooks",
            },
            capture_output=True,
            text=True,
            timeout=900,
        )
        report = done.stdout + done.stderr
        artifacts = REPO / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / "schemathesis.txt").write_text(report)
        assert done.returncode == 0, report[-8000:]
        assert cluster.server is not None
        assert "Traceback" not in cluster.server.log_tail(1_000_000)
    finally:
        cluster.stop()
