"""The core without a server: commands on a real SQLite database, as the
routes and the server's clock call them (submit, place, report, lose a
node, retry, cancel), and the domain errors it refuses with."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from api.core import clock, jobs, nodes, reports
from api.core.context import Core
from api.core.errors import Conflict, Forbidden, NotFound
from api.core.people import NOBODY
from api.settings import ServerSettings
from api.views import read_job
from db import queries
from db.engine import Database
from ddpo.failures import FailureReason
from ddpo.lifecycle import JobStatus, NodeState, PartStatus
from ddpo.schemas import (
    Assignment,
    JobSpec,
    NodeRegistration,
    PartFinished,
    ProgressBatch,
    ProgressReport,
    Topology,
    TrainResult,
)
from tests.api.conftest import wait_for
from tests.databases import fresh_database_url

HEARTBEAT_TIMEOUT_S = 0.3


@contextlib.contextmanager
def a_core(tmp_path: Path, heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S) -> Iterator[Core]:
    db = Database(fresh_database_url(tmp_path, "core"))
    db.prepare_schema()
    settings = ServerSettings(
        database_url=db.url,
        artifacts_dir=tmp_path / "artifacts",
        heartbeat_timeout_s=heartbeat_timeout_s,
        poll_wait_s=0.1,
        retry_backoff_s=0,
        retry_backoff_max_s=0,
    )
    try:
        yield Core(db, settings)
    finally:
        db.dispose()


@pytest.fixture
def core(tmp_path: Path) -> Iterator[Core]:
    with a_core(tmp_path) as made:
        yield made


# Long enough that the node kept heartbeating is never judged lost with the
# silent one, however long a loaded machine stalls this test between a
# heartbeat and the sweep (0.3 s was not, in CI).
LOST_TIMEOUT_S = 2.0


def join(core: Core, name: str) -> int:
    node_id, credential = nodes.register_node(
        core, NodeRegistration(name=name, address="10.0.0.1"), caller_node=None, enforce=False
    )
    assert credential is not None
    return node_id


def started(core: Core, node_id: int) -> list[Assignment]:
    """Poll as the node does, and report each assignment started."""
    assignments = nodes.poll_node(core, node_id, [], []).start
    for a in assignments:
        assert reports.part_started(core, a.part_id, node_id)
    return assignments


def finish(core: Core, node_id: int, part_id: int, **report: object) -> bool:
    return reports.finish_part(
        core, part_id, PartFinished.model_validate({"node_id": node_id, **report})
    )


def status(core: Core, job_id: int) -> JobStatus:
    return read_job(db=core.db, job_id=job_id).status


def test_a_job_waits_with_a_reason_until_a_node_joins_then_runs_to_success(core: Core) -> None:
    job_id, created = jobs.submit_job(core, JobSpec(epochs=1), NOBODY)
    assert created
    waiting = read_job(db=core.db, job_id=job_id)
    assert waiting.status is JobStatus.QUEUED and waiting.pending_reason

    node_id = join(core, "a")
    (assignment,) = started(core, node_id)
    assert assignment.job_id == job_id and assignment.machine_id == 0
    assert status(core, job_id) is JobStatus.RUNNING

    at = datetime.now(timezone.utc)
    batch = ProgressBatch(
        node_id=node_id,
        reports=[ProgressReport(seq=1, epoch=1, batch=5, batches_per_epoch=10, loss=0.5, at=at)],
    )
    assert reports.record_progress(core, assignment.part_id, batch)
    assert read_job(db=core.db, job_id=job_id).progress.percent == 50.0  # type: ignore[union-attr]

    result = TrainResult(test_accuracy=0.98, train_seconds=3.0)
    assert finish(core, node_id, assignment.part_id, status="succeeded", result=result)
    done = read_job(db=core.db, job_id=job_id)
    assert done.status is JobStatus.SUCCEEDED
    assert done.result == result


def test_a_gang_is_placed_on_distinct_nodes_at_once_or_not_at_all(core: Core) -> None:
    job_id, _ = jobs.submit_job(core, JobSpec(topology=Topology(num_machines=2)), NOBODY)
    a = join(core, "a")
    assert nodes.poll_node(core, a, [], []).start == []  # one node: nothing starts
    b = join(core, "b")
    machines = {x.machine_id: node for node in (a, b) for x in started(core, node)}
    assert machines == {0: a, 1: b} or machines == {0: b, 1: a}
    assert status(core, job_id) is JobStatus.RUNNING


def test_a_silent_node_is_lost_and_its_job_restarts_on_another(tmp_path: Path) -> None:
    with a_core(tmp_path, LOST_TIMEOUT_S) as core:
        a_silent_node_is_lost_and_its_job_restarts_on_another(core)


def a_silent_node_is_lost_and_its_job_restarts_on_another(core: Core) -> None:
    job_id, _ = jobs.submit_job(core, JobSpec(max_restarts=1), NOBODY)
    a = join(core, "a")
    (first,) = started(core, a)
    b = join(core, "b")
    deadline = time.monotonic() + 10
    while not clock.sweep_lost_nodes(core):  # b was heard from later than a
        assert time.monotonic() < deadline, "node a was never judged lost"
        nodes.heartbeat(core, b, [])
        time.sleep(0.02)
    with core.db.read() as session:
        assert queries.get_node(session=session, node_id=a).state is NodeState.LOST  # type: ignore[union-attr]
    # No backoff here: the sweep that lost node a placed the retry on b.
    retried = read_job(db=core.db, job_id=job_id)
    assert retried.status is JobStatus.RUNNING and retried.attempt == 2
    assert retried.attempts[0].error is not None
    assert retried.attempts[0].error.reason is FailureReason.NODE_LOST
    assert retried.parts[0].node_id == b
    (second,) = started(core, b)
    assert second.attempt_id != first.attempt_id
    # The lost attempt is fenced off: its late reports change nothing.
    late = ProgressReport(
        seq=1, epoch=1, batch=9, batches_per_epoch=10, at=datetime.now(timezone.utc)
    )
    assert not reports.record_progress(
        core, first.part_id, ProgressBatch(node_id=a, reports=[late])
    )
    assert read_job(db=core.db, job_id=job_id).progress is None
    assert not finish(core, a, first.part_id, status="succeeded")
    assert finish(core, b, second.part_id, status="succeeded")
    assert status(core, job_id) is JobStatus.SUCCEEDED


def test_a_sweep_that_finds_every_node_heard_takes_no_write_lock(tmp_path: Path) -> None:
    """The lock is everyone's: a turn of the sweep that loses no node must
    not hold it (with thousands of nodes the search is not short)."""
    with a_core(tmp_path, LOST_TIMEOUT_S) as core:
        a = join(core, "a")
        wait_for(
            lambda: core.sightings.listening_for() > LOST_TIMEOUT_S,
            what="the server judging silence",
        )
        # Its heartbeat time in the database is stale (sightings are written
        # once an interval), but this server has just heard from it.
        core.sightings.saw(a)
        transactions = core.db.write_lock.totals()[0]
        assert not clock.sweep_lost_nodes(core)
        assert core.db.write_lock.totals()[0] == transactions
        with core.db.read() as session:
            assert queries.get_node(session=session, node_id=a).state is NodeState.LIVE  # type: ignore[union-attr]


def test_a_crash_of_the_training_code_is_not_retried(core: Core) -> None:
    job_id, _ = jobs.submit_job(core, JobSpec(max_restarts=3), NOBODY)
    node_id = join(core, "a")
    (part,) = started(core, node_id)
    finish(core, node_id, part.part_id, status="failed", reason="rank_failed", exit_code=1)
    failed = read_job(db=core.db, job_id=job_id)
    assert failed.status is JobStatus.FAILED
    assert failed.error is not None and failed.error.reason is FailureReason.RANK_FAILED


def test_cancelling_stops_every_part_and_ends_once_the_nodes_confirm(core: Core) -> None:
    job_id, _ = jobs.submit_job(core, JobSpec(), NOBODY)
    node_id = join(core, "a")
    (part,) = started(core, node_id)
    jobs.cancel_job(core, job_id, NOBODY)
    assert status(core, job_id) is JobStatus.CANCELLING
    assert nodes.heartbeat(core, node_id, [part.part_id]).stop == [part.part_id]
    assert read_job(db=core.db, job_id=job_id).parts[0].status is PartStatus.STOPPING
    finish(core, node_id, part.part_id, status="cancelled", exit_code=-15)
    assert status(core, job_id) is JobStatus.CANCELLED
    with pytest.raises(Conflict, match=f"job {job_id} is already cancelled"):
        jobs.cancel_job(core, job_id, NOBODY)


def part_status(core: Core, part_id: int) -> PartStatus:
    with core.db.read() as session:
        part = queries.get_part(session=session, part_id=part_id)
        assert part is not None
        return part.status


def test_a_started_report_for_a_part_no_longer_to_run_changes_nothing(core: Core) -> None:
    jobs.submit_job(
        core, JobSpec(topology=Topology(num_machines=2, num_processes=1), max_restarts=1), NOBODY
    )
    a, b = join(core, "a"), join(core, "b")
    (first,) = started(core, a)
    (second,) = nodes.poll_node(core, b, [], []).start
    # Machine 0 fails before machine 1 says it started: machine 1 is asked
    # to stop, and its late "started" does not make it run.
    assert finish(core, a, first.part_id, status="failed", exit_code=1)
    assert not reports.part_started(core, second.part_id, b)
    assert part_status(core, second.part_id) is PartStatus.STOPPING
    # The fence itself: an assigned part of an attempt its job no longer
    # runs (as a writer beside this report could leave it) does not start.
    later_id, _ = jobs.submit_job(core, JobSpec(epochs=1), NOBODY)
    deadline = time.monotonic() + 10
    placed: list[tuple[int, Assignment]] = []
    while not placed:
        assert time.monotonic() < deadline, "the job was never placed"
        placed = [
            (node, x)
            for node in (a, b)
            for x in nodes.poll_node(core, node, [], []).start
            if x.job_id == later_id
        ]
    ((node_id, part),) = placed
    with core.db.write() as session:
        later = queries.get_job(session=session, job_id=later_id)
        assert later is not None and later.current_attempt_id is not None
        later.current_attempt_id += 1000
    assert not reports.part_started(core, part.part_id, node_id)
    assert part_status(core, part.part_id) is PartStatus.ASSIGNED


def test_the_core_refuses_with_domain_errors_that_name_the_thing(core: Core) -> None:
    with pytest.raises(NotFound, match="job 99 not found"):
        jobs.cancel_job(core, 99, NOBODY)
    with pytest.raises(NotFound, match="study 7 not found"):
        jobs.cancel_study(core, 7, NOBODY)
    jobs.submit_job(core, JobSpec(epochs=2), NOBODY, idempotency_key="k")
    assert jobs.submit_job(core, JobSpec(epochs=2), NOBODY, idempotency_key="k") == (1, False)
    with pytest.raises(Conflict, match="'k' was used for job 1 with a different spec"):
        jobs.submit_job(core, JobSpec(epochs=3), NOBODY, idempotency_key="k")
    a, b = join(core, "a"), join(core, "b")
    (part,) = started(core, a)
    with pytest.raises(Forbidden, match=f"part {part.part_id} is not assigned to node {b}"):
        reports.part_started(core, part.part_id, b)
    nodes.revoke_node(core, a, NOBODY)
    with pytest.raises(Forbidden, match="revoked"):
        nodes.poll_node(core, a, [], [])


def test_the_clock_fails_a_job_past_its_deadline_without_a_request(core: Core) -> None:
    job_id, _ = jobs.submit_job(core, JobSpec(max_run_seconds=0.05, max_restarts=2), NOBODY)
    node_id = join(core, "a")
    started(core, node_id)
    deadline = time.monotonic() + 10
    while status(core, job_id) is JobStatus.RUNNING:
        assert time.monotonic() < deadline, "the deadline never struck"
        clock.tick(core, judge_nodes=False)
        time.sleep(0.02)
    failed = read_job(db=core.db, job_id=job_id)
    assert failed.status is JobStatus.FAILED
    assert failed.error is not None and failed.error.reason is FailureReason.DEADLINE
    assert failed.parts[0].status is PartStatus.STOPPING  # its node is told to stop it


def test_a_submit_into_a_full_cluster_reads_none_of_the_queue(
    core: Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that cannot start even at the head of the line changes no one
    else's plan: its submit costs the same with 300 queued as with none.
    One that could start has the whole line planned, and waits its turn."""
    node = join(core, "a")
    running, _ = jobs.submit_job(core, JobSpec(), NOBODY)
    (assignment,) = started(core, node)
    assert assignment.job_id == running
    other = join(core, "b")
    jobs.submit_job(core, JobSpec(), NOBODY)
    assert len(started(core, other)) == 1  # both slots taken
    wide = JobSpec(topology=Topology(num_machines=2))
    queued = [jobs.submit_job(core, wide, NOBODY)[0] for _ in range(300)]
    surveys: list[int] = []
    real = queries.queued_jobs

    def counted(**kwargs: object) -> list[object]:
        found = real(**kwargs)  # type: ignore[arg-type]
        surveys.append(len(found))
        return found  # type: ignore[return-value]

    monkeypatch.setattr(queries, "queued_jobs", counted)
    late, _ = jobs.submit_job(core, JobSpec(), NOBODY)
    assert surveys == []
    assert "waiting for 1 free node(s)" in (read_job(db=core.db, job_id=late).pending_reason or "")
    assert status(core, queued[0]) is JobStatus.QUEUED

    # A slot frees: the first in line (two machines) cannot start on it,
    # and the late one-machine job does not overtake it.
    assert finish(core, node, assignment.part_id, status="succeeded", exit_code=0)
    assert status(core, queued[0]) is JobStatus.QUEUED
    assert status(core, late) is JobStatus.QUEUED
    # A job that could start now has the whole line planned: behind the
    # first in line, it waits too.
    surveys.clear()
    later, _ = jobs.submit_job(core, JobSpec(), NOBODY)
    assert surveys == [302]
    assert status(core, later) is JobStatus.QUEUED
    # Ahead of everyone (a higher priority), it starts at once.
    urgent, _ = jobs.submit_job(core, JobSpec(priority=5), NOBODY)
    assert status(core, urgent) is JobStatus.RUNNING


def test_sessions_that_find_a_memo_stale_together_compute_it_once(core: Core) -> None:
    """The moment a node changes, every submit and plan in flight finds the
    live nodes' memo stale: one reads the nodes, the others wait for it and
    take its value, and a node's change after that is read again."""
    from db.engine import memoized
    from db.models import Node

    calls: list[int] = []
    release = threading.Event()

    def compute() -> int:
        calls.append(len(calls) + 1)
        release.wait(10)
        return len(calls)

    got: list[int] = []

    def asking() -> None:
        with core.db.read() as session:
            got.append(memoized(session, "test_nodes", (Node,), compute))

    threads = [threading.Thread(target=asking) for _ in range(8)]
    for thread in threads:
        thread.start()
    # Each computing at once would call in well within this; one at a time,
    # only the first does until it is released.
    deadline = time.monotonic() + 1.0
    while len(calls) < len(threads) and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    for thread in threads:
        thread.join(10)
    assert calls == [1] and got == [1] * len(threads)

    join(core, "n1")
    with core.db.read() as session:
        assert memoized(session, "test_nodes", (Node,), compute) == 2
