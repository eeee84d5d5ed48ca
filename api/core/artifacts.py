"""Checkpoints: an upload is staged, then kept as the job's newest (the one
before it removed) in the artifacts directory or the artifact store; or
machine 0 writes it to the store itself and the server keeps the record.
Served from wherever it is, with its SHA-256 for the reader to check."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

from sqlmodel import Session

from api.core import lookup
from api.core.context import Core
from api.core.errors import Conflict, NotFound, TooLarge, Unavailable
from api.settings import ServerSettings
from db import queries
from db.models import Job
from ddpo import store
from ddpo.schemas import CheckpointStored

log = logging.getLogger(__name__)


# Staged uploads of a server that has not run for this long are orphans
# (a server moved to another port or host): any server removes them.
ORPHANED_AFTER_S = 24 * 3600


def _incoming(settings: ServerSettings) -> Path:
    """This server's staging folder: its own, since several servers may share
    the artifacts directory (NFS), and one must not remove what another is
    receiving."""
    return settings.artifacts_dir / ".incoming" / f"{socket.gethostname()}-{settings.port}"


def staging_path(settings: ServerSettings) -> Path:
    """Where an upload's bytes go while they arrive (a fresh name each time)."""
    incoming = _incoming(settings)
    incoming.mkdir(parents=True, exist_ok=True)
    return incoming / uuid.uuid4().hex


def clear_incoming(settings: ServerSettings) -> int:
    """At start: remove what this server was receiving when it stopped (a
    kill -9 leaves partial uploads, outside the quota), and any server's
    staged files that are a day old. The number of files removed."""
    removed = 0
    root = settings.artifacts_dir / ".incoming"
    # This server's, and those an earlier version staged straight in .incoming.
    ours = (_incoming(settings), root)
    now = time.time()
    for path in root.glob("**/*"):
        if path.is_file() and (
            path.parent in ours or now - path.stat().st_mtime > ORPHANED_AFTER_S
        ):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _folder(settings: ServerSettings, job_id: int) -> Path:
    return settings.artifacts_dir / f"job-{job_id}"


@dataclass(frozen=True)
class Position:
    """Where a checkpoint was taken: after ``epoch``, or after ``step``
    within ``epoch`` (a stop's)."""

    epoch: int
    step: int | None = None

    @property
    def whole_epochs(self) -> int:
        """The epochs it holds whole: a stop's holds the ones before its own."""
        return self.epoch if self.step is None else self.epoch - 1

    def order(self) -> tuple[int, int]:
        """Later positions sort later: a stop within epoch E comes after the
        end of epoch E - 1 and before the end of E."""
        return (self.whole_epochs, -1 if self.step is None else self.step)

    def file_name(self) -> str:
        return store.checkpoint_name(self.epoch, self.step)


def kept_position(job: Job) -> Position | None:
    if job.checkpoint_epoch is None:
        return None
    if job.checkpoint_step is None:
        return Position(job.checkpoint_epoch)
    return Position(job.checkpoint_epoch + 1, job.checkpoint_step)


def _resumed_from(session: Session, attempt_id: int, job: Job) -> bool:
    """Whether the kept checkpoint is the one this attempt started from:
    anything it saves is newer, though an elastic job resized counts its
    steps in batches of another size (a lower number may come later)."""
    attempt = queries.get_attempt(session=session, attempt_id=attempt_id)
    return (
        attempt is not None
        and attempt.num_machines is not None
        and (attempt.resumed_from_epoch, attempt.resumed_from_step)
        == (job.checkpoint_epoch, job.checkpoint_step)
    )


def check_upload(core: Core, part_id: int, node_id: int, at: Position) -> int:
    """Refuse an upload before its bytes are read: wrong node, not machine 0,
    an epoch the job does not have. The part's job id."""
    with core.db.read() as session:
        part = lookup.owned_part(session, part_id, node_id)
        if part.machine_id != 0:
            raise Conflict(f"part {part_id} is machine {part.machine_id}; rank 0 is on machine 0")
        spec = lookup.job(session, part.job_id).spec
        epochs = spec.epochs
        # A script counts its epochs itself (in its arguments); a trainer's are the spec's.
        if spec.script is None and at.epoch > epochs:
            raise Conflict(f"epoch: job {part.job_id} has {epochs} epoch(s), not {at.epoch}")
        return part.job_id


def room_for_uploads(core: Core) -> Callable[[], int]:
    """What the uploads arriving now may add up to: the quota less what is
    kept. Read once as an upload starts; checkpoints kept meanwhile through
    this server are counted as they are (``Uploads.kept``), so it never
    overstates the room."""
    # Marked before the read: a keep in between is counted twice, never missed.
    mark = core.uploads.kept_so_far()
    with core.db.read() as session:
        kept = queries.checkpoint_bytes_kept(session=session)
    quota = core.settings.artifacts_quota_mb * 2**20
    return lambda: quota - kept - (core.uploads.kept_so_far() - mark)


def keep_checkpoint(
    core: Core, part_id: int, node_id: int, at: Position, staged: Path, size: int, sha256: str
) -> bool:
    """Keep an uploaded checkpoint (a staged file) as the job's newest (see
    ``_keep``). With an artifact store, the file is copied there first,
    outside the transaction (it may take minutes), under a name of its own."""
    placed = _place_in_store(core, part_id, node_id, at, staged)
    if placed is None:
        return _keep(core, part_id, node_id, at, _Moved(staged, at.file_name()), size, sha256)
    staged.unlink(missing_ok=True)
    return _keep(core, part_id, node_id, at, _InStore(placed.url), size, sha256)


def record_stored(core: Core, part_id: int, body: CheckpointStored) -> bool:
    """Keep a checkpoint machine 0 wrote to the artifact store itself, once
    the store shows an object of the job's, of the size reported. What a
    node reports is checked, never trusted: the object must be in the job's
    folder under a name ``store.put`` gives, and hold the bytes it says."""
    at = Position(body.epoch, body.step)
    job_id = check_upload(core, part_id, body.node_id, at)
    root = core.settings.artifact_store
    if root is None:
        raise Conflict(
            "url: this server has no artifact store (DDPO_ARTIFACT_STORE): upload the "
            f"checkpoint to PUT /parts/{part_id}/checkpoint"
        )
    if not store.is_jobs_object(body.url, root, job_id):
        raise Conflict(
            f"url: {body.url!r} is not a checkpoint of job {job_id} "
            f"(expected {store.job_folder(root, job_id)}<id>-epoch-<E>.pt or -step-<S>.pt)"
        )
    _check_room(core, body.size)
    try:
        found = store.size_of(body.url)
    except FileNotFoundError:
        raise Conflict(f"url: the artifact store has no object at {body.url}") from None
    except (OSError, store.StoreError) as exc:
        raise Unavailable(f"the artifact store cannot be read: {exc}") from exc
    if found != body.size:
        # Not whole (or not what was said): not kept, and not left behind,
        # unless it is the one the job keeps (a node naming it with a wrong
        # size must not remove it).
        with core.db.read() as session:
            kept = lookup.job(session, job_id).checkpoint_file
        if body.url != kept:
            _discard_object(job_id, body.url)
        raise Conflict(f"size: the object at {body.url} holds {found} bytes, not {body.size}")
    return _keep(core, part_id, body.node_id, at, _InStore(body.url), body.size, body.sha256)


def _check_room(core: Core, size: int) -> None:
    """A checkpoint recorded (not uploaded) still counts against the size
    cap and the quota, as its bytes would have."""
    settings = core.settings
    if size > settings.max_checkpoint_mb * 2**20:
        raise TooLarge(
            f"size: checkpoint larger than DDPO_MAX_CHECKPOINT_MB={settings.max_checkpoint_mb}"
        )
    if size > room_for_uploads(core)():
        raise TooLarge(
            "size: the checkpoints kept and arriving would pass "
            f"DDPO_ARTIFACTS_QUOTA_MB={settings.artifacts_quota_mb}"
        )


@dataclass(frozen=True)
class _Moved:
    """A staged upload, moved into the job's folder here when kept."""

    staged: Path
    file_name: str

    def keep(self, settings: ServerSettings, job_id: int) -> str:
        folder = _folder(settings, job_id)
        folder.mkdir(parents=True, exist_ok=True)
        os.replace(self.staged, folder / self.file_name)
        return self.file_name

    def discard(self, job_id: int) -> None:
        self.staged.unlink(missing_ok=True)


@dataclass(frozen=True)
class _InStore:
    """An object in the artifact store, recorded by its URL when kept."""

    url: str

    def keep(self, settings: ServerSettings, job_id: int) -> str:
        return self.url

    def discard(self, job_id: int) -> None:
        _discard_object(job_id, self.url)


def _keep(
    core: Core,
    part_id: int,
    node_id: int,
    at: Position,
    checkpoint: _Moved | _InStore,
    size: int,
    sha256: str,
) -> bool:
    """Record ``checkpoint`` as the job's newest: only from the current
    attempt of a job that has not ended (a finished job's final model stays
    what it was), and never older than the one kept. One not kept is
    discarded; the one it replaces is removed once the record is committed."""
    replaced: str | None = None
    with core.db.write() as session:
        part = lookup.owned_part(session, part_id, node_id)
        job = lookup.job(session, part.job_id, for_update=True)
        kept = kept_position(job)
        assert job.id is not None
        job_id = job.id
        if (
            job.current_attempt_id != part.attempt_id
            or job.status.is_terminal()
            or part.status.is_terminal()
            or (
                kept is not None
                and at.order() < kept.order()
                and not _resumed_from(session, part.attempt_id, job)
            )
        ):
            if not (isinstance(checkpoint, _InStore) and checkpoint.url == job.checkpoint_file):
                checkpoint.discard(job_id)  # (a resent record of the kept one stays)
            return False
        name = checkpoint.keep(core.settings, job_id)
        if job.checkpoint_file and job.checkpoint_file != name:
            replaced = job.checkpoint_file
        job.checkpoint_epoch, job.checkpoint_step = at.whole_epochs, at.step
        job.checkpoint_file, job.checkpoint_bytes = name, size
        job.checkpoint_sha256 = sha256
        log.info(
            "job %d: checkpoint of epoch %d%s kept (%d bytes)%s",
            job_id,
            at.epoch,
            "" if at.step is None else f" step {at.step}",
            size,
            f" at {name}" if store.is_object(name) else "",
        )
    if replaced is not None:  # once committed: nothing refers to it any more
        remove_checkpoint(core.settings, job_id, replaced)
    core.uploads.kept(size)  # once committed
    return True


def _place_in_store(
    core: Core, part_id: int, node_id: int, at: Position, staged: Path
) -> store.Stored | None:
    """The staged file copied into the artifact store (None without one)."""
    root = core.settings.artifact_store
    if root is None:
        return None
    with core.db.read() as session:
        job_id = lookup.owned_part(session, part_id, node_id).job_id
    try:
        return store.put(store.job_folder(root, job_id), at.file_name(), staged)
    except (OSError, store.StoreError) as exc:
        # The node retries the upload; the store's trouble is said here.
        log.error("job %d: checkpoint not written to %s: %s", job_id, root, exc)
        raise Unavailable(f"the artifact store cannot be written to: {exc}") from exc


def _discard_object(job_id: int, url: str) -> None:
    try:
        store.remove(url)
    except (OSError, store.StoreError) as exc:
        log.warning("job %d: checkpoint %s not removed: %s", job_id, url, exc)


def remove_checkpoint(settings: ServerSettings, job_id: int, name: str) -> None:
    """Remove a checkpoint no longer kept: a store's object or a file here."""
    if store.is_object(name):
        _discard_object(job_id, name)
    else:
        (_folder(settings, job_id) / name).unlink(missing_ok=True)


def _kept_checkpoint(core: Core, job_id: int) -> tuple[str, int, str | None]:
    """The job's newest checkpoint (a store's URL, or a file name here), its
    epoch and its SHA-256."""
    with core.db.read() as session:
        job = lookup.job(session, job_id)
        if job.checkpoint_file is None or job.checkpoint_epoch is None:
            raise NotFound(
                f"job {job_id} has no checkpoint: its final model, of epoch "
                f"{job.checkpoint_epoch}, was removed (DDPO_CHECKPOINT_RETENTION_DAYS, "
                "DDPO_MAX_KEPT_CHECKPOINTS)"
                if job.status.is_terminal() and job.checkpoint_epoch is not None
                else f"job {job_id} has no checkpoint: it ended ({job.status.value}) before "
                "its first epoch did"
                if job.status.is_terminal()
                else f"job {job_id} has no checkpoint yet: rank 0 writes one at the end "
                "of every epoch"
            )
        return job.checkpoint_file, job.checkpoint_epoch, job.checkpoint_sha256


@dataclass(frozen=True)
class Opened:
    """A kept checkpoint, opened, with its size, epoch and SHA-256 (if known)."""

    file: BinaryIO
    size: int
    epoch: int
    sha256: str | None


def open_checkpoint(core: Core, job_id: int) -> Opened:
    """The job's newest checkpoint, opened (so that removing it from now on,
    as retention does, cannot cut its download short)."""
    for _ in range(2):
        # A newer checkpoint or retention may remove it between the read
        # and the open: read again, and say why if it is gone.
        name, epoch, sha256 = _kept_checkpoint(core, job_id)
        try:
            if store.is_object(name):
                opened, size = store.open_object(name)
                return Opened(cast(BinaryIO, opened), size, epoch, sha256)
            file = (_folder(core.settings, job_id) / name).open("rb")
            return Opened(file, os.fstat(file.fileno()).st_size, epoch, sha256)
        except FileNotFoundError:
            continue
        except (OSError, store.StoreError) as exc:
            raise Unavailable(f"job {job_id}'s checkpoint cannot be read: {exc}") from exc
    raise NotFound(f"job {job_id}'s checkpoint of epoch {epoch} was just removed")
