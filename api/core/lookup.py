"""The rows a command acts on, or the domain error that says why not; and
the fence every report from a node passes."""

from __future__ import annotations

from sqlmodel import Session

from api.core.errors import Forbidden, NotFound
from db import queries
from db.models import Attempt, Job, Part
from ddpo.lifecycle import JobStatus


def job(session: Session, job_id: int, *, for_update: bool = False) -> Job:
    found = queries.get_job(session=session, job_id=job_id, for_update=for_update)
    if found is None:
        raise NotFound(f"job {job_id} not found")
    return found


def owned_part(session: Session, part_id: int, node_id: int, *, for_update: bool = False) -> Part:
    """The part, if it was given to this node (locked until the
    transaction ends with ``for_update``)."""
    part = queries.get_part(session=session, part_id=part_id, for_update=for_update)
    return _owned(part, part_id, node_id)


def owned_part_and_job(
    found: tuple[Part, Job, Attempt | None] | None, part_id: int, node_id: int
) -> tuple[Part, Job, Attempt | None]:
    """What db/queries.py parts_and_jobs found for ``part_id``, if that
    part was given to this node."""
    _owned(None if found is None else found[0], part_id, node_id)
    assert found is not None
    return found


def _owned(part: Part | None, part_id: int, node_id: int) -> Part:
    if part is None:
        raise NotFound(f"part {part_id} not found")
    if part.node_id != node_id:
        raise Forbidden(f"part {part_id} is not assigned to node {node_id}")
    return part


def is_current(session: Session, part: Part) -> bool:
    """Whether the part belongs to the attempt its job is running now: the
    fence every report from a node passes."""
    found = queries.get_job(session=session, job_id=part.job_id)
    return (
        found is not None
        and found.current_attempt_id == part.attempt_id
        and found.status is JobStatus.RUNNING
    )
