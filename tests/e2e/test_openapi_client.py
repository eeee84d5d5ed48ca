"""The server's OpenAPI document as a generator uses it: ``openapi-python-client``
makes a client from the running server's /openapi.json, and a job is
submitted, waited for and listed with it; a wrong token is a typed 401
(a ``Problem``), not a silent ``None``."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from cli.cluster import LocalCluster

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent


@pytest.fixture
def generated(cluster: LocalCluster, tmp_path: Path) -> Iterator[ModuleType]:
    """The generated package, importable as ``ddpo_client``."""
    document = tmp_path / "openapi.json"
    document.write_bytes(httpx.get(f"{cluster.url}/openapi.json").raise_for_status().content)
    subprocess.run(
        [str(BIN / "openapi-python-client"), "generate", "--path", str(document), "--meta", "none"],
        cwd=tmp_path,
        # Its post hooks run ruff, which this environment has.
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
        check=True,
        capture_output=True,
        timeout=300,
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("ddpo_client")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == "ddpo_client" or n.startswith("ddpo_client.")]:
            del sys.modules[name]


def test_a_generated_client_submits_waits_lists_and_gets_a_typed_401(
    cluster: LocalCluster, generated: ModuleType
) -> None:
    jobs_api = importlib.import_module("ddpo_client.api.jobs")
    submit_job = importlib.import_module("ddpo_client.api.jobs.submit_job")
    get_job = importlib.import_module("ddpo_client.api.jobs.get_job")
    list_jobs = importlib.import_module("ddpo_client.api.jobs.list_jobs")
    models = importlib.import_module("ddpo_client.models")
    assert jobs_api is not None
    assert cluster.tokens is not None
    with (
        generated.AuthenticatedClient(base_url=cluster.url, token=cluster.tokens.user) as client,
        generated.AuthenticatedClient(base_url=cluster.url, token="not-a-token") as wrong,
    ):
        drive(models, client, wrong, submit_job, get_job, list_jobs)


def drive(
    models: ModuleType,
    client: object,
    wrong: object,
    submit_job: ModuleType,
    get_job: ModuleType,
    list_jobs: ModuleType,
) -> None:
    spec = models.JobSpec.from_dict(
        {"name": "generated", "max_steps_per_epoch": 20, "topology": {"num_machines": 1}}
    )
    job = submit_job.sync(client=client, body=spec)
    assert isinstance(job, models.JobPublic), job
    deadline = time.monotonic() + 300
    while job.status not in (models.JobStatus.SUCCEEDED, models.JobStatus.FAILED):
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
        job = get_job.sync(job.id, client=client)
        assert isinstance(job, models.JobPublic), job
    assert job.status is models.JobStatus.SUCCEEDED
    assert job.result.test_accuracy > 0.5  # a typed TrainResult
    listed = list_jobs.sync(client=client, limit=500)
    assert job.id in [j.id for j in listed.data]

    refused = get_job.sync_detailed(job.id, client=wrong)
    assert refused.status_code == 401
    assert isinstance(refused.parsed, models.Problem), refused.parsed
    assert isinstance(get_job.sync(job.id, client=wrong), models.Problem)
    invalid = submit_job.sync(client=client, body=models.JobSpec.from_dict({"epochs": 0}))
    assert isinstance(invalid, models.Problem)
    assert invalid.detail[0].msg.startswith("epochs: "), invalid.detail
