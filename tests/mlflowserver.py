"""A real MLflow tracking server for the tracking tests: ``mlflow server``
from PyPI's ``mlflow`` (the test extra), its runs in a SQLite file and its
artifacts served by the server itself (``--artifacts-destination``), so a
client needs only the tracking URI, as with a team's shared server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from cli.cluster import free_port


@dataclass
class MLflowServer:
    url: str
    process: subprocess.Popen[bytes]


def start(directory: Path) -> Iterator[MLflowServer]:
    executable = shutil.which("mlflow", path=str(Path(sys.executable).parent))
    assert executable, "mlflow is not installed (pip install mlflow: the test extra)"
    port = free_port()
    log = directory / "mlflow.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                executable,
                "server",
                "--backend-store-uri",
                f"sqlite:///{directory / 'mlflow.db'}",
                "--artifacts-destination",
                str(directory / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=directory,
            start_new_session=True,
        )
    server = MLflowServer(f"http://127.0.0.1:{port}", process)
    try:
        deadline = time.monotonic() + 120  # its first start migrates its database
        while True:
            try:
                if httpx.get(f"{server.url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"mlflow server did not start: {log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield server
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
