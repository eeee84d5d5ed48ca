"""ddpo/store.py against a directory and a real S3-compatible server
(tests/objectstore.py): objects written once under fresh names, read back
whole, removed; store URLs we cannot use are refused naming why."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ddpo import store
from tests.objectstore import S3Server


def blob(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(os.urandom(size))
    return path


def roundtrip(root: str, source: Path, tmp_path: Path) -> str:
    folder = store.job_folder(root, 7)
    first = store.put(folder, "epoch-1.pt", source)
    second = store.put(folder, "epoch-1.pt", source)
    assert first.url != second.url  # never overwritten: a reader never sees half of one
    assert first.url.startswith(f"{root}/job-7/") and first.url.endswith("-epoch-1.pt")
    assert store.is_jobs_object(first.url, root, 7)
    written = source.read_bytes()
    assert (first.size, first.sha256) == (len(written), hashlib.sha256(written).hexdigest())
    assert store.size_of(first.url) == len(written)
    opened, size = store.open_object(first.url)
    with opened:
        assert size == len(written) and opened.read() == written
    copy = tmp_path / "resume.pt"
    assert store.fetch(first.url, copy, first.sha256) == len(written)
    assert copy.read_bytes() == written
    # A damaged copy (or a record that lies): refused, and nothing left behind.
    damaged = tmp_path / "damaged.pt"
    with pytest.raises(store.DigestMismatch, match="damaged"):
        store.fetch(first.url, damaged, hashlib.sha256(b"other bytes").hexdigest())
    assert not damaged.exists() and list(tmp_path.glob("*.partial")) == []
    store.remove(first.url)
    store.remove(first.url)  # gone already: not an error
    with pytest.raises(FileNotFoundError):
        store.open_object(first.url)
    return second.url


def test_a_directory_store_keeps_objects_under_fresh_names(tmp_path: Path) -> None:
    root = store.check(f"file://{tmp_path}/shared/ddpo/")
    assert root == f"file://{tmp_path}/shared/ddpo"
    kept = roundtrip(root, blob(tmp_path, 3 * store.CHUNK + 11), tmp_path)
    assert [p.name for p in (tmp_path / "shared/ddpo/job-7").iterdir()] == [kept.rsplit("/")[-1]]


def test_an_s3_store_keeps_objects_in_the_bucket_in_parts(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    root = store.check(f"s3://{bucket}/team-a")
    # Larger than a part: a multipart upload.
    kept = roundtrip(root, blob(tmp_path, 2 * store.CHUNK + 5), tmp_path)
    assert s3.keys(bucket) == [kept.split(f"s3://{bucket}/", 1)[1]]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("/shared/ddpo", "is not a URL"),
        ("file://shared/ddpo", "absolute path"),
        ("nope://bucket/x", "nope"),
    ],
)
def test_a_store_url_we_cannot_use_is_refused_naming_why(url: str, says: str) -> None:
    with pytest.raises(store.StoreError, match=says):
        store.check(url)


@pytest.mark.parametrize(
    "url",
    [
        "s3://bucket/team/job-8/0123456789ab-epoch-1.pt",  # another job's
        "s3://bucket/team/job-7/../job-8/0123456789ab-epoch-1.pt",
        "s3://bucket/team/job-7/0123456789ab-epoch-1.pt/../../x",
        "s3://bucket/team/job-7/epoch-1.pt",  # not a name put gives
        "s3://bucket/team/job-7/0123456789ab-epoch-1.pt.tmp",
        "s3://bucket/other/job-7/0123456789ab-epoch-1.pt",  # outside the store
        "file:///etc/passwd",
    ],
)
def test_only_an_object_put_would_write_for_the_job_is_its_checkpoint(url: str) -> None:
    """What a node reports as the checkpoint it wrote is checked, never trusted."""
    root = "s3://bucket/team"
    assert store.is_jobs_object(f"{root}/job-7/0123456789ab-step-41.pt", root, 7)
    assert not store.is_jobs_object(url, root, 7)


def test_an_empty_checkpoint_is_an_empty_object(tmp_path: Path, s3: S3Server) -> None:
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    for root in (f"file://{tmp_path}/shared", f"s3://{s3.new_bucket()}/team"):
        written = store.put(store.job_folder(root, 7), "epoch-1.pt", empty)
        assert (written.size, written.sha256) == (0, hashlib.sha256(b"").hexdigest())
        assert store.size_of(written.url) == 0
