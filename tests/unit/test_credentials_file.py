"""The node credential on disk: owner-only, replaced whole."""

from __future__ import annotations

import stat
from pathlib import Path

from worker import credentials


def test_a_saved_credential_is_read_back_and_only_its_owner_can_read_it(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "node-credential"
    assert credentials.load(path) is None
    credentials.save(path, "ddpo-node-first")
    credentials.save(path, "ddpo-node-second")
    assert credentials.load(path) == "ddpo-node-second"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["node-credential"]
