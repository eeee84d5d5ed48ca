"""Fixtures every kind of test may use."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import mlflowserver, objectstore
from tests.mlflowserver import MLflowServer
from tests.objectstore import S3Server

REPO = Path(__file__).resolve().parents[1]
MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@pytest.fixture(scope="session", autouse=True)
def _drop_test_databases() -> Iterator[None]:
    """The PostgreSQL databases the session's tests made go with it."""
    yield
    from tests.databases import drop_made

    drop_made()


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The directory whose MNIST/raw holds the real MNIST files."""
    candidates = [Path(os.environ["DDPO_DATA_DIR"])] if "DDPO_DATA_DIR" in os.environ else []
    candidates += [REPO / "data", REPO.parent / "shared" / "data"]
    for root in candidates:
        if all((root / "MNIST" / "raw" / name).exists() for name in MNIST_FILES):
            return root.resolve()
    pytest.fail(
        "MNIST files not found; set DDPO_DATA_DIR to a directory whose MNIST/raw holds "
        f"{', '.join(MNIST_FILES)} (looked in {', '.join(map(str, candidates))})"
    )


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One S3-compatible server for the session (s3fs keeps its clients, and
    their endpoint, for the life of the process)."""
    yield from objectstore.start(tmp_path_factory.mktemp("s3") / "moto.log")


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLflowServer]:
    """One MLflow tracking server for the session (it takes seconds to start)."""
    yield from mlflowserver.start(tmp_path_factory.mktemp("mlflow"))
