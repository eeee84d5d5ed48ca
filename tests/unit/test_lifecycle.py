from __future__ import annotations

import itertools

import pytest

from db.queries import ACTIVE_PART_STATUSES
from ddpo.lifecycle import (
    JOB_TRANSITIONS,
    PART_TRANSITIONS,
    IllegalTransition,
    JobStatus,
    PartStatus,
    backoff_seconds,
    can_cancel,
    move_job,
    move_part,
    settle_job,
)

J, P = JobStatus, PartStatus

ALLOWED_JOB_MOVES = {
    (J.QUEUED, J.RUNNING),
    (J.QUEUED, J.CANCELLED),
    (J.QUEUED, J.FAILED),  # a job waiting to retry ran out of time
    (J.RUNNING, J.QUEUED),  # a retryable failure with restarts left
    (J.RUNNING, J.SUCCEEDED),
    (J.RUNNING, J.FAILED),
    (J.RUNNING, J.CANCELLING),
    (J.CANCELLING, J.CANCELLED),
}


@pytest.mark.parametrize("current,new", list(itertools.product(J, J)))
def test_every_job_move_is_allowed_or_refused(current: JobStatus, new: JobStatus) -> None:
    if (current, new) in ALLOWED_JOB_MOVES:
        assert move_job(current, new) is new
    else:
        with pytest.raises(IllegalTransition, match=f"from {current.value} to {new.value}"):
            move_job(current, new)


ALLOWED_PART_MOVES = {
    (P.ASSIGNED, P.RUNNING),
    (P.ASSIGNED, P.STOPPING),
    (P.ASSIGNED, P.FAILED),
    (P.ASSIGNED, P.CANCELLED),
    (P.ASSIGNED, P.LOST),
    (P.RUNNING, P.SUCCEEDED),
    (P.RUNNING, P.FAILED),
    (P.RUNNING, P.STOPPING),
    (P.RUNNING, P.LOST),
    (P.RUNNING, P.STOPPED),  # stopped at a step, as asked (the cooperative stop)
    (P.STOPPING, P.STOPPED),  # ... then cancelled before the stop landed
    (P.STOPPING, P.CANCELLED),
    (P.STOPPING, P.SUCCEEDED),
    (P.STOPPING, P.FAILED),
    (P.STOPPING, P.LOST),
}


@pytest.mark.parametrize("current,new", list(itertools.product(P, P)))
def test_every_part_move_is_allowed_or_refused(current: PartStatus, new: PartStatus) -> None:
    if (current, new) in ALLOWED_PART_MOVES:
        assert move_part(current, new) is new
    else:
        with pytest.raises(IllegalTransition):
            move_part(current, new)


def test_terminal_states_have_no_way_out() -> None:
    for status, targets in JOB_TRANSITIONS.items():
        assert status.is_terminal() == (not targets)
    for part_status, part_targets in PART_TRANSITIONS.items():
        assert part_status.is_terminal() == (not part_targets)


def test_database_agrees_on_which_parts_hold_processes() -> None:
    assert set(ACTIVE_PART_STATUSES) == {s.value for s in P if s.is_active()}


def test_cancel_is_possible_until_the_job_ends() -> None:
    assert [s for s in J if can_cancel(s)] == [J.QUEUED, J.RUNNING, J.CANCELLING]


@pytest.mark.parametrize(
    "parts,expected",
    [
        ([P.RUNNING, P.RUNNING], J.RUNNING),
        ([P.SUCCEEDED, P.RUNNING], J.RUNNING),
        ([P.SUCCEEDED, P.SUCCEEDED], J.SUCCEEDED),
        ([P.FAILED, P.RUNNING], J.FAILED),
        ([P.SUCCEEDED, P.LOST], J.FAILED),
        ([P.ASSIGNED, P.LOST], J.FAILED),
        ([P.CANCELLED, P.RUNNING], J.FAILED),  # stopped without being asked to
        ([P.STOPPED, P.RUNNING], J.FAILED),  # ... at a step, but nobody asked
    ],
)
def test_settling_a_running_job(parts: list[PartStatus], expected: JobStatus) -> None:
    assert settle_job(J.RUNNING, parts) is expected


@pytest.mark.parametrize(
    "parts,expected",
    [
        # Nothing is decided while a part may still be stopping at its step.
        ([P.STOPPED, P.RUNNING], J.RUNNING),
        ([P.FAILED, P.STOPPING], J.RUNNING),
        ([P.STOPPED, P.STOPPED], J.QUEUED),
        # Stopped by signal past the deadline: back to the queue all the same.
        ([P.STOPPED, P.CANCELLED], J.QUEUED),
        ([P.LOST, P.STOPPED], J.QUEUED),
        # Every part finished before the request landed.
        ([P.SUCCEEDED, P.SUCCEEDED], J.SUCCEEDED),
        ([P.SUCCEEDED, P.STOPPED], J.QUEUED),
    ],
)
def test_settling_a_job_asked_to_stop_at_a_step(
    parts: list[PartStatus], expected: JobStatus
) -> None:
    assert settle_job(J.RUNNING, parts, stopping=True) is expected


def test_a_cancelling_job_waits_for_every_part_to_stop() -> None:
    assert settle_job(J.CANCELLING, [P.CANCELLED, P.STOPPING]) is J.CANCELLING
    assert settle_job(J.CANCELLING, [P.CANCELLED, P.LOST]) is J.CANCELLED
    assert settle_job(J.CANCELLING, [P.CANCELLED, P.SUCCEEDED]) is J.CANCELLED


@pytest.mark.parametrize("status", [s for s in J if s.is_terminal()] + [J.QUEUED])
def test_settling_leaves_other_states_alone(status: JobStatus) -> None:
    assert settle_job(status, [P.FAILED, P.SUCCEEDED]) is status


def test_backoff_doubles_up_to_its_cap() -> None:
    waits = [backoff_seconds(n, base_s=1.0, cap_s=5.0) for n in range(5)]
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
