"""Objects in an artifact store named by URL (``DDPO_ARTIFACT_STORE``):
``file:///shared/ddpo`` for a directory every server and worker mounts,
``s3://bucket/prefix`` for S3 and S3-compatible stores, with the endpoint,
region and credentials from the usual AWS variables
(``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``, ...).

Through fsspec (s3fs for ``s3://``): the library Lightning, PyTorch's
distributed checkpoint and Hugging Face already write through, one API over
local paths, S3, GCS and Azure, with multipart uploads and ranged reads.
It is imported on first use: a server with no store loads none of it.

Objects are written once under a fresh name and never overwritten, so a
reader never sees half of one; the database says which is a job's newest,
with its size and SHA-256, which every reader checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

# What is written and read at a time: S3's multipart parts (5 MiB at least,
# 10,000 at most: objects up to 156 GiB) and each ranged GET of a read, so a
# checkpoint of any size passes through a bounded buffer. Fewer, larger
# requests cost less time (reading 512 MiB from the test's S3 server took
# 20 s in 8 MiB ranges, 5 s in 32 MiB ones; writes the same), more memory
# (a 1 GB checkpoint raised the writing worker's memory by 70 MB in 8 MiB
# parts, 110 in 16 MiB, 128 in 32 MiB: s3fs and botocore hold copies of a
# part, and their import is about 40 of it).
CHUNK = 16 * 2**20


# A job's object: `<store>/job-<id>/<12 hex>-epoch-<E>.pt` or `...-step-<S>.pt`,
# the only names a node may report (nothing of another job's, no "..").
_OBJECT_NAME = re.compile(r"[0-9a-f]{12}-(epoch|step)-[0-9]{1,19}\.pt")


class StoreError(RuntimeError):
    """The store cannot be used as configured (its message says why)."""


class DigestMismatch(StoreError):
    """What was read is not what was written (its SHA-256 differs)."""


@dataclass(frozen=True)
class Stored:
    """An object written: where, how many bytes, their SHA-256 (hex)."""

    url: str
    size: int
    sha256: str


def _filesystem(url: str) -> tuple[Any, str]:
    import fsspec  # lazily: s3fs brings aiobotocore

    try:
        fs, path = fsspec.core.url_to_fs(url)
    except ImportError as exc:
        raise StoreError(f"{url}: {exc} (for s3://, install ddpo's s3 extra)") from exc
    except ValueError as exc:
        raise StoreError(f"{url}: {exc}") from exc
    return fs, path


def _fresh(url: str) -> tuple[Any, str]:
    """The filesystem and path, with nothing cached of what is at the path:
    s3fs remembers folder listings for the life of the process, and another
    process (a node, another server) writes objects it has not seen."""
    fs, path = _filesystem(url)
    fs.invalidate_cache(path)
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


def checkpoint_name(epoch: int, step: int | None) -> str:
    """A checkpoint's base name: after ``epoch``, or a stop's after ``step``."""
    return f"epoch-{epoch}.pt" if step is None else f"step-{step}.pt"


def job_folder(root: str, job_id: int) -> str:
    """Where a job's objects go (a URL ending in "/")."""
    return f"{root}/job-{job_id}/"


def is_jobs_object(url: str, root: str, job_id: int) -> bool:
    """Whether ``url`` names an object ``put`` would write for ``job_id``
    under ``root``: what a node may report as its checkpoint."""
    folder = job_folder(root, job_id)
    return url.startswith(folder) and _OBJECT_NAME.fullmatch(url[len(folder) :]) is not None


def put(folder: str, base: str, source: Path) -> Stored:
    """Copy ``source`` into the store as ``base`` under ``folder`` (a URL
    ending in "/"), made unique, chunk by chunk, hashing as it goes."""
    return Upload(folder, base, source).advance()


class Upload:
    """One object's write that survives a cut connection: what is in the
    store stays there, and :meth:`advance` goes on from the first byte that
    is not. On S3 a multipart upload of CHUNK-sized parts, its id and
    finished parts kept here; on a directory a ``.partial`` file beside the
    object, renamed to it when whole (a reader never sees half of one).

    Whatever :meth:`advance` raises leaves the upload where its last
    finished part left it; :meth:`abort` gives it up and removes what was
    written."""

    def __init__(self, folder: str, base: str, source: Path) -> None:
        self.url = f"{folder}{uuid.uuid4().hex[:12]}-{base}"
        self.source = source
        self.sent = 0  # bytes of source in the store, in order
        self._digest = hashlib.sha256()  # of those bytes
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []

    def advance(self) -> Stored:
        """Write the rest of the source; the object once whole."""
        fs, path = _filesystem(self.url)
        if _local(fs):
            self._advance_in_directory(path)
        else:
            self._advance_in_parts(fs, path)
        return Stored(self.url, self.sent, self._digest.hexdigest())

    def _advance_in_directory(self, path: str) -> None:
        partial = Path(path + ".partial")
        partial.parent.mkdir(parents=True, exist_ok=True)
        with open(self.source, "rb") as src, open(partial, "r+b" if self.sent else "wb") as dst:
            src.seek(self.sent)
            dst.seek(self.sent)
            dst.truncate()  # whatever a cut write left past the last whole chunk
            while chunk := src.read(CHUNK):
                dst.write(chunk)
                dst.flush()
                self._took(chunk)
        os.replace(partial, path)

    def _advance_in_parts(self, fs: Any, path: str) -> None:
        bucket, key, _ = fs.split_path(path)
        if self._upload_id is None:
            made = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)
            self._upload_id = made["UploadId"]
        with open(self.source, "rb") as src:
            src.seek(self.sent)
            # At least one part: an empty source is one empty part.
            while (chunk := src.read(CHUNK)) or not self._parts:
                number = len(self._parts) + 1
                sent = fs.call_s3(
                    "upload_part",
                    Bucket=bucket,
                    Key=key,
                    UploadId=self._upload_id,
                    PartNumber=number,
                    Body=chunk,
                )
                self._parts.append({"PartNumber": number, "ETag": sent["ETag"]})
                self._took(chunk)
        try:
            fs.call_s3(
                "complete_multipart_upload",
                Bucket=bucket,
                Key=key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},
            )
        except FileNotFoundError:
            # No such upload: completed by an earlier call whose answer was
            # lost on the way back, if the object is there whole.
            fs.invalidate_cache(path)
            if not fs.exists(path) or int(fs.size(path)) != self.sent:
                raise
        self._upload_id = None
        fs.invalidate_cache(path)  # this process's listings now lack it

    def _took(self, chunk: bytes) -> None:
        self._digest.update(chunk)
        self.sent += len(chunk)

    def abort(self) -> None:
        """Give the write up: nothing of it is left in the store (as far as
        the store can be reached; S3 buckets also expire abandoned uploads
        by lifecycle rule)."""
        with contextlib.suppress(Exception):
            fs, path = _filesystem(self.url)
            if _local(fs):
                Path(path + ".partial").unlink(missing_ok=True)
            elif self._upload_id is not None:
                bucket, key, _ = fs.split_path(path)
                fs.call_s3(
                    "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=self._upload_id
                )


def is_unusable(exc: BaseException) -> bool:
    """Whether a write failed because the store cannot be used from here as
    configured (no credentials, no permission, no such bucket or directory,
    its library missing) rather than because a connection was cut: the
    first will fail the same way next time, the second may go on."""
    if isinstance(
        exc,
        StoreError
        | ImportError
        | PermissionError
        | FileNotFoundError
        | FileExistsError
        | NotADirectoryError
        | IsADirectoryError,
    ):
        return True
    try:
        from botocore import exceptions as boto
    except ImportError:
        return False
    return isinstance(
        exc,
        boto.NoCredentialsError
        | boto.PartialCredentialsError
        | boto.NoRegionError
        | boto.ParamValidationError,
    )


def size_of(url: str) -> int:
    """The object's size (FileNotFoundError if there is none)."""
    fs, path = _fresh(url)
    return int(fs.size(path))


def fetch(url: str, destination: Path, sha256: str | None) -> int:
    """The object written whole to ``destination`` (through a ``.partial``
    file, chunk by chunk), its SHA-256 checked when known; its size."""
    partial = destination.with_name(destination.name + ".partial")
    fs, path = _fresh(url)
    # No cache: each read below is one ranged GET of CHUNK bytes.
    opened = fs.open(path, "rb", block_size=CHUNK, cache_type="none")
    digest = hashlib.sha256()
    size = 0
    with opened as src, open(partial, "wb") as out:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    check_digest(url, digest, sha256, partial)
    os.replace(partial, destination)
    return size


def check_digest(what: str, digest: Any, expected: str | None, partial: Path) -> None:
    """Raise DigestMismatch (removing ``partial``) when ``digest`` is not ``expected``."""
    if expected is not None and digest.hexdigest() != expected:
        partial.unlink(missing_ok=True)
        raise DigestMismatch(
            f"{what}: SHA-256 {digest.hexdigest()} read, {expected} written: the copy is damaged"
        )


def open_object(url: str) -> tuple[IO[bytes], int]:
    """The object opened for reading, and its size."""
    fs, path = _fresh(url)
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
