"""A script job's checkpoint put back for its retry: a plain tar that
``ddpo.save_checkpoint`` wrote, from the server, which took it from the
job's machine 0, a node. Unpacked as untrusted data: it cannot write more
than it holds, or outside the directory.

A plain tar's files cannot add up to more than the archive itself, so the
archive's own size is the cap on what it unpacks to, checked before
anything is written. A compressed archive (300 KB of gzip unpacked to
300 MB in the review as an attacker) and sparse files (whose sizes the
archive does not hold) are refused; so are more than MAX_MEMBERS entries
and anything but files and folders.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

MAX_MEMBERS = 10_000


class CheckpointRefused(tarfile.TarError):
    """Why a checkpoint archive is not unpacked."""


def unpack_checkpoint(archive_path: Path, directory: Path) -> None:
    try:
        # "r:": plain tar only; a compressed one fails to open.
        with tarfile.open(archive_path, "r:") as archive:
            _check(archive, cap=archive_path.stat().st_size)
            # "data": no links out, no devices, no absolute or ../ paths.
            archive.extractall(directory, filter="data")
    except tarfile.ReadError as exc:
        raise CheckpointRefused(f"not a plain tar ({exc}); compression is refused") from None


def _check(archive: tarfile.TarFile, cap: int) -> None:
    total = 0
    for count, member in enumerate(archive, start=1):
        if count > MAX_MEMBERS:
            raise CheckpointRefused(f"more than {MAX_MEMBERS} entries")
        if member.issparse() or not (member.isfile() or member.isdir()):
            raise CheckpointRefused(f"{member.name!r} is not a plain file or folder")
        total += member.size
        if total > cap:
            raise CheckpointRefused(f"its files add up to more than the archive's own {cap} bytes")
