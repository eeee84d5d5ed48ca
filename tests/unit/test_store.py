"""ddpo/store.py against a directory and a real S3-compatible server
(tests/objectstore.py): objects written once under fresh names, read back
whole, removed; store URLs we cannot use are refused naming why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddpo import store
from tests.objectstore import S3Server


def blob(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(os.urandom(size))
    return path


def roundtrip(root: str, source: Path) -> str:
    first = store.put(root, "job-7/epoch-1.pt", source)
    second = store.put(root, "job-7/epoch-1.pt", source)
    assert first != second  # never overwritten: a reader never sees half of one
    assert first.startswith(f"{root}/job-7/") and first.endswith("-epoch-1.pt")
    opened, size = store.open_object(first)
    with opened:
        assert size == source.stat().st_size and opened.read() == source.read_bytes()
    store.remove(first)
    store.remove(first)  # gone already: not an error
    with pytest.raises(FileNotFoundError):
        store.open_object(first)
    return second


def test_a_directory_store_keeps_objects_under_fresh_names(tmp_path: Path) -> None:
    root = store.check(f"file://{tmp_path}/shared/ddpo/")
    assert root == f"file://{tmp_path}/shared/ddpo"
    kept = roundtrip(root, blob(tmp_path, 3 * store.CHUNK + 11))
    assert [p.name for p in (tmp_path / "shared/ddpo/job-7").iterdir()] == [kept.rsplit("/")[-1]]


def test_an_s3_store_keeps_objects_in_the_bucket_in_parts(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    root = store.check(f"s3://{bucket}/team-a")
    # Larger than a part: a multipart upload.
    kept = roundtrip(root, blob(tmp_path, 2 * store.CHUNK + 5))
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
