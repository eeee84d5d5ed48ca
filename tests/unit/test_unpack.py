"""A checkpoint archive from the server is untrusted: it unpacks to no more
than its own size, plain files and folders only (worker/unpack.py)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

import ddpo
from worker import runfiles
from worker.unpack import MAX_MEMBERS, CheckpointRefused, unpack_checkpoint


def disk_use(folder: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in folder.rglob("*") if f.is_file())


def test_a_gzip_bomb_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    bomb = tmp_path / "checkpoint.tar"  # the name a retry's node gives what it fetched
    zeros = 64 * 2**20
    with tarfile.open(bomb, "w:gz") as archive:
        info = tarfile.TarInfo("model.pt")
        info.size = zeros
        archive.addfile(info, io.BytesIO(bytes(zeros)))
    assert bomb.stat().st_size < zeros / 100  # about 64 KB that would unpack to 64 MB
    target = tmp_path / "checkpoint"
    target.mkdir()
    with pytest.raises(CheckpointRefused, match="compression is refused"):
        unpack_checkpoint(bomb, target)
    assert list(target.iterdir()) == []
    assert disk_use(target) == 0


def test_a_header_that_claims_more_than_the_archive_holds_is_refused(tmp_path: Path) -> None:
    archive_path = tmp_path / "lies.tar"
    info = tarfile.TarInfo("model.pt")
    info.size = 2**30  # claimed; the archive is a few KB
    with open(archive_path, "wb") as f:
        f.write(info.tobuf(format=tarfile.PAX_FORMAT))
        f.write(bytes(4096))
    with pytest.raises(tarfile.TarError):
        unpack_checkpoint(archive_path, tmp_path / "out")
    assert not (tmp_path / "out" / "model.pt").exists()


def test_links_and_too_many_entries_are_refused(tmp_path: Path) -> None:
    linked = tmp_path / "linked.tar"
    with tarfile.open(linked, "w") as archive:
        info = tarfile.TarInfo("model.pt")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        archive.addfile(info)
    with pytest.raises(CheckpointRefused, match="not a plain file or folder"):
        unpack_checkpoint(linked, tmp_path / "out")

    many = tmp_path / "many.tar"
    with tarfile.open(many, "w") as archive:
        for i in range(MAX_MEMBERS + 1):
            archive.addfile(tarfile.TarInfo(f"f{i}"), io.BytesIO(b""))
    with pytest.raises(CheckpointRefused, match=f"more than {MAX_MEMBERS} entries"):
        unpack_checkpoint(many, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_what_ddpo_saves_unpacks_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "run"
    (source / "checkpoint").mkdir(parents=True)
    (source / "checkpoint" / "model.pt").write_bytes(b"weights" * 1000)
    (source / "checkpoint" / "opt").mkdir()
    (source / "checkpoint" / "opt" / "state.pt").write_bytes(b"adadelta" * 100)
    monkeypatch.setenv(ddpo.RUN_DIR_ENV, str(source))
    monkeypatch.setenv(ddpo.CHECKPOINT_DIR_ENV, str(source / "checkpoint"))
    monkeypatch.setenv("RANK", "0")
    ddpo.save_checkpoint(epoch=1)
    latest = runfiles.latest_checkpoint(source)
    assert latest is not None
    saved, epoch = latest
    assert epoch == 1
    target = tmp_path / "back"
    target.mkdir()
    unpack_checkpoint(saved, target)
    assert (target / "model.pt").read_bytes() == b"weights" * 1000
    assert (target / "opt" / "state.pt").read_bytes() == b"adadelta" * 100
