"""A real S3-compatible server for the tests: moto's (``moto_server``, from
PyPI's ``moto[server]``), on a free loopback port, speaking the S3 wire
protocol (signed requests, multipart uploads) to s3fs as AWS would.

Why moto: it installs from the registry with pip like every other test
dependency, starts in a second and needs no disk of its own; MinIO, the
usual choice, ships as a binary outside PyPI. What the tests check is our
side of the protocol, not a store's durability.

The endpoint and credentials go into the environment (``AWS_ENDPOINT_URL``
and the rest), where s3fs and every process the tests start read them, as
they would on a real deployment."""

from __future__ import annotations

import os
import secrets
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
class S3Server:
    url: str
    process: subprocess.Popen[bytes]

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "ddpo-test",
            "AWS_SECRET_ACCESS_KEY": "ddpo-test-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def new_bucket(self) -> str:
        """A fresh, empty bucket's name."""
        import fsspec

        name = f"ddpo-{secrets.token_hex(4)}"
        fsspec.filesystem("s3").mkdir(name)
        return name

    def keys(self, bucket: str) -> list[str]:
        """Every object's key in the bucket."""
        import fsspec

        fs = fsspec.filesystem("s3")
        fs.invalidate_cache()
        return sorted(path.split("/", 1)[1] for path in fs.find(bucket))


def start(log: Path) -> Iterator[S3Server]:
    executable = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    assert executable, "moto_server is not installed (pip install 'moto[server]')"
    port = free_port()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [executable, "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = S3Server(f"http://127.0.0.1:{port}", process)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(server.url, timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"moto_server did not start: {log.read_text()}") from None
                time.sleep(0.1)
        before = {name: os.environ.get(name) for name in server.env}
        os.environ.update(server.env)
        try:
            yield server
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)
