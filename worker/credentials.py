"""The node's credential on disk: what lets a restarted daemon take its node
back (the join token only makes new nodes). Readable by its owner only."""

from __future__ import annotations

import os
from pathlib import Path


def load(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return text or None


def move_from(legacy: Path, path: Path) -> None:
    """Take a credential kept where earlier versions kept it (inside the work
    directory, two levels above every rank's working directory)."""
    if legacy.exists() and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(legacy, path)


def save(path: Path, credential: str) -> None:
    """Replace the file whole: a crash mid-write leaves the old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(credential + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)
