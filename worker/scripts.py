"""The operator's script directory: which scripts a node offers (each by its
path there and the SHA-256 of its content), and finding the one a job names
without ever leaving the directory."""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

from ddpo.schemas import ScriptRef
from ddpo.schemas.protocol import ScriptOffer
from ddpo.schemas.spec import SCRIPT_PATH_PATTERN

log = logging.getLogger(__name__)

# What one registration reports at most (the protocol's bound).
MAX_SCRIPTS = 1024


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def scan(directory: Path | None) -> list[ScriptOffer]:
    """Every ``.py`` file under ``directory`` a job may name, sorted by path.
    Files whose names a job could not spell, hidden directories, and links
    that lead out of the directory are left out."""
    if directory is None:
        return []
    root = directory.resolve()
    if not root.is_dir():
        # Said loudly: a job naming a script here would wait for a node that
        # offers it, and nothing else would say why.
        log.warning(
            "the script directory %s (DDPO_SCRIPT_DIR / --script-dir %s%s) is not a directory: "
            "this node offers no scripts",
            root,
            directory,
            ", relative to the worker's working directory" if not directory.is_absolute() else "",
        )
        return []
    found: list[ScriptOffer] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if not re.fullmatch(SCRIPT_PATH_PATTERN, relative) or not path.is_file():
            continue
        if not path.resolve().is_relative_to(root):
            log.warning("script %s is a link out of %s: not offered", relative, root)
            continue
        if len(found) == MAX_SCRIPTS:
            log.warning("more than %d scripts in %s: the rest are not offered", MAX_SCRIPTS, root)
            break
        found.append(ScriptOffer(path=relative, sha256=sha256_of(path)))
    return found


class ScriptUnavailable(RuntimeError):
    pass


def locate(directory: Path | None, ref: ScriptRef) -> Path:
    """The file ``ref`` names, checked to be inside the directory and (when
    the job is pinned to one) to have the content the job expects."""
    if directory is None:
        raise ScriptUnavailable("this node has no script directory (--script-dir)")
    root = directory.resolve()
    path = (root / ref.path).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise ScriptUnavailable(f"script {ref.path!r} is not in {root}")
    if ref.sha256 is not None and sha256_of(path) != ref.sha256:
        raise ScriptUnavailable(
            f"script {ref.path!r} changed since the job was submitted "
            f"(its SHA-256 is no longer {ref.sha256[:12]}...)"
        )
    return path
