"""Objects in an artifact store named by URL (``DDPO_ARTIFACT_STORE``):
``file:///shared/ddpo`` for a directory every server (and, later, every
worker) mounts, ``s3://bucket/prefix`` for S3 and S3-compatible stores,
with the endpoint, region and credentials from the usual AWS variables
(``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``, ...).

Through fsspec (s3fs for ``s3://``): the library Lightning, PyTorch's
distributed checkpoint and Hugging Face already write through, one API over
local paths, S3, GCS and Azure, with multipart uploads and ranged reads.
It is imported on first use: a server with no store loads none of it.

Objects are written once under a fresh name and never overwritten, so a
reader never sees half of one; the database says which is a job's newest.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from pathlib import Path
from typing import IO, Any

# Large enough for S3's multipart parts (5 MiB at least), small enough that
# a checkpoint of any size passes through a bounded buffer.
CHUNK = 8 * 2**20


class StoreError(RuntimeError):
    """The store cannot be used as configured (its message says why)."""


def _filesystem(url: str) -> tuple[Any, str]:
    import fsspec  # lazily: s3fs brings aiobotocore

    try:
        fs, path = fsspec.core.url_to_fs(url)
    except ImportError as exc:
        raise StoreError(f"{url}: {exc} (for s3://, install ddpo's s3 extra)") from exc
    except ValueError as exc:
        raise StoreError(f"{url}: {exc}") from exc
    return fs, path


def check(url: str) -> str:
    """``url`` as a store's root (no trailing slash), or StoreError naming
    what is wrong with it."""
    root = url.rstrip("/")
    if "://" not in root:
        raise StoreError(f"{url!r} is not a URL (file:///path, s3://bucket/prefix)")
    scheme = root.split("://", 1)[0]
    if scheme == "file" and not root.startswith("file:///"):
        raise StoreError(f"{url!r}: a file:// URL names an absolute path (file:///path)")
    _filesystem(root)
    return root


def _local(fs: Any) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocols or "local" in protocols


def put(root: str, name: str, source: Path) -> str:
    """Copy ``source`` into the store under ``name`` (made unique), chunk by
    chunk; the object's URL."""
    folder, _, base = name.rpartition("/")
    url = f"{root}/{folder + '/' if folder else ''}{uuid.uuid4().hex[:12]}-{base}"
    fs, path = _filesystem(url)
    if _local(fs):
        fs.makedirs(path.rpartition("/")[0], exist_ok=True)
    with open(source, "rb") as src, fs.open(path, "wb", block_size=CHUNK) as dst:
        shutil.copyfileobj(src, dst, CHUNK)
    return url


def open_object(url: str) -> tuple[IO[bytes], int]:
    """The object opened for reading, and its size."""
    fs, path = _filesystem(url)
    size = int(fs.size(path))
    return fs.open(path, "rb", block_size=CHUNK), size


def remove(url: str) -> None:
    """Remove the object; one already gone is not an error."""
    fs, path = _filesystem(url)
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(path)


def is_object(name: str) -> bool:
    """Whether a job's recorded checkpoint is a store's object (a URL) rather
    than a file in the server's own artifacts directory (a bare name)."""
    return "://" in name
