"""Core.writes: submits and reports that arrive while another holds the
writer are made together in the next transaction (api/core/context.py,
api/core/placement.py)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from sqlmodel import Session

from api.core import jobs, nodes, placement
from api.core.context import Core, Grouped, GroupedWrites
from api.core.errors import Conflict, Forbidden, TooMany
from api.core.people import Actor
from api.views import read_job
from db import queries
from db.engine import Database
from ddpo.lifecycle import JobStatus
from ddpo.schemas import JobSpec, NodeRegistration, Topology, TrainResult
from ddpo.schemas.people import AuditAction
from tests.api.conftest import wait_for
from tests.unit.test_core import a_core, finish, join, started, status

ALICE = Actor(name="alice", role="user")


def _in_threads(calls: list[Callable[[], Any]]) -> tuple[list[threading.Thread], dict[int, Any]]:
    """Each call in a thread of its own; what each returned or raised, by index."""
    outcomes: dict[int, Any] = {}

    def run(index: int, call: Callable[[], Any]) -> None:
        try:
            outcomes[index] = call()
        except Exception as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    return threads, outcomes


def test_writes_arriving_during_a_group_are_written_together_in_the_next() -> None:
    writes = GroupedWrites()
    groups: list[list[int]] = []
    first_began, release = threading.Event(), threading.Event()

    def write(take: Callable[[], list[Grouped[Any]]]) -> None:
        groups.append([])
        for one in take():
            one.value = one.work(None)  # type: ignore[arg-type]
            groups[-1].append(one.value)
        if not first_began.is_set():
            first_began.set()
            assert release.wait(10)

    def call(n: int) -> Any:
        grouped = Grouped(lambda _session, n=n: n)
        writes.run(grouped, write)
        assert grouped.done
        return grouped.value

    first, outcomes = _in_threads([lambda: call(0)])
    assert first_began.wait(10)
    others, later = _in_threads([lambda n=n: call(n) for n in range(1, 6)])
    wait_for(lambda: writes.waiting == 5, what="five writes waiting on the first group")
    release.set()
    for thread in [*first, *others]:
        thread.join(10)
    # The first group held only its own; the five that came meanwhile, one group.
    assert len(groups) == 2 and groups[0] == [0] and sorted(groups[1]) == [1, 2, 3, 4, 5]
    assert outcomes == {0: 0} and later == {i - 1: i for i in range(1, 6)}
    assert writes.waiting == 0


def test_a_group_takes_at_most_its_size_and_every_write_is_made_in_order() -> None:
    writes = GroupedWrites(most=3)
    groups: list[list[int]] = []
    block = threading.Lock()
    block.acquire()

    def write(take: Callable[[], list[Grouped[Any]]]) -> None:
        group = take()
        with block if not groups else contextlib.nullcontext():
            groups.append([one.work(None) for one in group])  # type: ignore[arg-type]

    first, _ = _in_threads([lambda: writes.run(Grouped(lambda _s: -1), write)])
    wait_for(lambda: writes.waiting == 0 and writes._writing, what="the first group writing")
    for n in range(8):
        # One at a time, so they queue in this order.
        threads, _ = _in_threads([lambda n=n: writes.run(Grouped(lambda _s, n=n: n), write)])
        first += threads
        wait_for(lambda n=n: writes.waiting == n + 1, what=f"{n + 1} waiting")
    block.release()
    for thread in first:
        thread.join(10)
    assert groups == [[-1], [0, 1, 2], [3, 4, 5], [6, 7]]


def test_a_group_that_fails_fails_each_of_its_writes_and_the_next_is_written() -> None:
    writes = GroupedWrites()

    def broken(take: Callable[[], list[Grouped[Any]]]) -> None:
        raise RuntimeError("database gone")  # before it took its group

    grouped: Grouped[int] = Grouped(lambda _s: 1)
    writes.run(grouped, broken)
    assert grouped.done and isinstance(grouped.error, RuntimeError)

    def fine(take: Callable[[], list[Grouped[Any]]]) -> None:
        for one in take():
            one.value = 2

    again: Grouped[int] = Grouped(lambda _s: 2)
    writes.run(again, fine)
    assert again.value == 2 and again.error is None


@pytest.fixture
def core(tmp_path: Path) -> Iterator[Core]:
    with a_core(tmp_path) as made:
        yield made


def watch_savepoints(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each transaction a group is written in, as it is written: whether
    its writes had a savepoint each."""
    written: list[bool] = []
    write = placement._write

    def watched(
        core: Core, take: Callable[[], list[Grouped[Any]]], *, savepoints: bool, planning: bool
    ) -> None:
        written.append(savepoints)
        write(core, take, savepoints=savepoints, planning=planning)

    monkeypatch.setattr(placement, "_write", watched)
    return written


def count_groups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """For each group written, once written: how many writes it held."""
    sizes: list[int] = []
    write_group = placement._write_group

    def counted(core: Core, take: Callable[[], list[Grouped[Any]]]) -> None:
        write_group(core, take)
        sizes.append(len(take()))

    monkeypatch.setattr(placement, "_write_group", counted)
    return sizes


def hold_the_writer(core: Core) -> tuple[list[threading.Thread], threading.Event]:
    """A write that holds the writer until the event returned is set: the
    writes that arrive meanwhile wait for the next group."""
    began, release = threading.Event(), threading.Event()

    def holding(session: Session) -> tuple[None, bool]:
        began.set()
        assert release.wait(10)
        return None, False

    holder, _ = _in_threads([lambda: placement.write_grouped(core, holding)])
    assert began.wait(10)
    return holder, release


def one_group(core: Core, calls: list[Callable[[], Any]]) -> tuple[list[Any], list[str]]:
    """Each call in a thread of its own, queued one at a time (so in this
    order) behind a write holding the writer, then let through together:
    what each returned or raised, and the statements sent meanwhile (upper
    case, spaces squeezed)."""
    holder, release = hold_the_writer(core)
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(" ".join(statement.split()).upper())

    threads: list[threading.Thread] = []
    outcomes: list[dict[int, Any]] = []
    for n, call in enumerate(calls):
        more, outcome = _in_threads([call])
        threads += more
        outcomes.append(outcome)
        wait_for(lambda n=n: core.writes.waiting == n + 1, what=f"{n + 1} writes waiting")
    event.listen(Engine, "before_cursor_execute", seen)
    try:
        release.set()
        for thread in [*holder, *threads]:
            thread.join(10)
    finally:
        event.remove(Engine, "before_cursor_execute", seen)
    return [outcome[0] for outcome in outcomes], statements


def test_a_refused_write_in_a_group_leaves_nothing_and_the_others_written_in_one_transaction(
    core: Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    join(core, "n0")
    kept, _ = jobs.submit_job(core, JobSpec(name="kept"), ALICE, idempotency_key="k")
    transactions = count_groups(monkeypatch)
    written = watch_savepoints(monkeypatch)

    def half_written(session: Session) -> tuple[None, bool]:
        queries.insert_job(
            session=session,
            spec=JobSpec(name="half"),
            name="half",
            idempotency_key=None,
            owner=None,
        )
        raise Conflict("refused after writing")

    holder, release = hold_the_writer(core)
    threads, outcomes = _in_threads(
        [
            lambda: jobs.submit_job(core, JobSpec(name="b", epochs=2), ALICE),
            # The same key with another spec: refused.
            lambda: jobs.submit_job(core, JobSpec(name="other"), ALICE, idempotency_key="k"),
            lambda: jobs.submit_job(core, JobSpec(name="d", epochs=3), ALICE),
            # Refused after it has written: what it wrote goes with it.
            lambda: placement.write_grouped(core, half_written),
        ]
    )
    wait_for(lambda: core.writes.waiting == 4, what="four writes waiting for the writer")
    release.set()
    for thread in [*holder, *threads]:
        thread.join(10)

    assert isinstance(outcomes[1], Conflict) and isinstance(outcomes[3], Conflict)
    (b, b_new), (d, d_new) = outcomes[0], outcomes[2]
    assert b_new and d_new and len({kept, b, d}) == 3
    with core.db.read() as session:
        listed = queries.list_jobs(session=session, status=None, limit=10, offset=0)[0]
    names = {job.name: job for job in listed}
    assert sorted(job.name for job in listed) == ["b", "d", "kept"]  # each once
    assert names["b"].spec.epochs == 2 and names["d"].spec.epochs == 3
    # The holder's group, then one group of all four: written without
    # savepoints until the write that raised having written, then again
    # with a savepoint each.
    assert transactions == [1, 4]
    assert written == [False, False, True]


def test_writes_arriving_while_the_writer_waits_for_another_servers_transaction_join_its_group(
    core: Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two servers on one database: while the other holds the write lock,
    a submit here waits for it as this server's writer, and the submits
    arriving meanwhile are written in the same transaction, not the next."""
    other = Database(core.db.url)  # another server on the same database
    groups = count_groups(monkeypatch)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with other.write() as session:
            session.execute(text("SELECT 1"))  # SQLite's BEGIN IMMEDIATE is sent with it
            held.set()
            assert release.wait(10)

    try:
        holder, _ = _in_threads([hold])
        assert held.wait(10)
        first, outcomes = _in_threads([lambda: jobs.submit_job(core, JobSpec(name="a"), ALICE)])
        wait_for(lambda: core.writes._writing, what="this server's writer waiting for the lock")
        more, later = _in_threads(
            [lambda n=n: jobs.submit_job(core, JobSpec(name=n), ALICE) for n in ("b", "c")]
        )
        # None taken yet: the writer takes its group once it holds the lock.
        wait_for(lambda: core.writes.waiting == 3, what="three submits waiting")
        release.set()
        for thread in [*holder, *first, *more]:
            thread.join(10)
    finally:
        release.set()
        other.dispose()

    assert groups == [3]
    assert all(new for _, new in [outcomes[0], later[0], later[1]])
    with core.db.read() as session:
        listed = queries.list_jobs(session=session, status=None, limit=10, offset=0)[0]
    assert sorted(job.name for job in listed) == ["a", "b", "c"]


def test_writes_refused_before_they_write_leave_the_group_one_transaction_without_savepoints(
    core: Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    join(core, "n0")
    jobs.submit_job(core, JobSpec(name="kept"), ALICE, idempotency_key="k")
    written = watch_savepoints(monkeypatch)
    holder, release = hold_the_writer(core)
    threads, outcomes = _in_threads(
        [
            lambda: jobs.submit_job(core, JobSpec(name="other"), ALICE, idempotency_key="k"),
            lambda: jobs.submit_job(core, JobSpec(name="b", epochs=2), ALICE),
            lambda: jobs.submit_job(core, JobSpec(name="again"), ALICE, idempotency_key="k"),
        ]
    )
    wait_for(lambda: core.writes.waiting == 3, what="three writes waiting for the writer")
    release.set()
    for thread in [*holder, *threads]:
        thread.join(10)

    assert isinstance(outcomes[0], Conflict) and isinstance(outcomes[2], Conflict)
    _, b_new = outcomes[1]
    assert b_new
    with core.db.read() as session:
        listed = queries.list_jobs(session=session, status=None, limit=10, offset=0)[0]
    assert sorted(job.name for job in listed) == ["b", "kept"]
    assert written == [False, False]  # the holder's, then all three in one


def test_submits_arriving_together_are_decided_in_order_and_their_jobs_inserted_at_once(
    core: Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No node: every job stays queued, and counts against its owner's cap.
    core.settings = core.settings.model_copy(update={"max_queued_jobs_per_person": 3})
    jobs.submit_job(core, JobSpec(name="before"), ALICE)
    written = watch_savepoints(monkeypatch)
    bob = Actor(name="bob", role="user")
    calls: list[Callable[[], Any]] = [
        lambda: jobs.submit_job(core, JobSpec(name="a"), ALICE, idempotency_key="k1"),
        # Sent again in the same group: the job the first made, not a second.
        lambda: jobs.submit_job(core, JobSpec(name="a"), ALICE, idempotency_key="k1"),
        lambda: jobs.submit_job(core, JobSpec(name="other"), ALICE, idempotency_key="k1"),
        lambda: jobs.submit_job(core, JobSpec(name="b"), ALICE),
        # Alice has three queued now (before, a, b): refused.
        lambda: jobs.submit_job(core, JobSpec(name="c"), ALICE),
        lambda: jobs.submit_job(core, JobSpec(name="d"), bob),
    ]
    answers, statements = one_group(core, calls)
    (a, a_new), (a_again, again_new), conflict, (b, b_new), refused, (d, d_new) = answers
    assert a_new and b_new and d_new and not again_new and a_again == a
    assert a < b < d  # in the order they came
    assert isinstance(conflict, Conflict) and f"job {a} with a different spec" in str(conflict)
    assert isinstance(refused, TooMany) and "alice has 3 queued" in str(refused)
    with core.db.read() as session:
        listed = queries.list_jobs(session=session, status=None, limit=10, offset=0)[0]
        audited = queries.audit_entries(session=session, limit=10, action=AuditAction.JOB_SUBMIT)
    assert sorted((job.name, job.owner) for job in listed) == [
        ("a", "alice"),
        ("b", "alice"),
        ("before", "alice"),
        ("d", "bob"),
    ]
    assert {job.idempotency_key for job in listed if job.name == "a"} == {"k1"}
    assert sorted(entry.target for entry in audited)[-3:] == sorted(f"job {i}" for i in (a, b, d))
    # One transaction after the holder's, no savepoints; on PostgreSQL one
    # statement inserted the three new jobs (a round trip each under the
    # write lock, otherwise). SQLAlchemy inserts a row a statement on
    # SQLite, whose RETURNING rows come in no promised order (in process:
    # no round trip to save).
    assert written == [False, False]
    inserts = [one for one in statements if one.startswith("INSERT INTO JOB ")]
    assert len(inserts) == (3 if core.db.is_sqlite else 1)


def test_a_groups_plan_starts_the_jobs_it_submitted_without_reading_them_or_their_nodes_again(
    core: Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    node_ids = [
        nodes.register_node(
            core, NodeRegistration(name=f"n{i}", address=f"10.0.0.{7 + i}"), None, enforce=False
        )[0]
        for i in range(3)
    ]
    written = watch_savepoints(monkeypatch)
    two_machines = JobSpec(name="b", topology=Topology(num_machines=2))
    answers, statements = one_group(
        core,
        [
            lambda: jobs.submit_job(core, JobSpec(name="a", max_steps_per_epoch=1), ALICE),
            lambda: jobs.submit_job(core, two_machines, ALICE),
        ],
    )
    (a, _), (b, _) = answers
    assert status(core, a) is JobStatus.RUNNING and status(core, b) is JobStatus.RUNNING
    # Each machine's assignment names the address of the node machine 0 is on.
    starts = {node_id: nodes.poll_node(core, node_id, [], []).start for node_id in node_ids}
    b_parts = [(n, s) for n, found in starts.items() for s in found if s.job_id == b]
    (b_first,) = [node_id for node_id, s in b_parts if s.machine_id == 0]
    addresses = dict(zip(node_ids, ("10.0.0.7", "10.0.0.8", "10.0.0.9"), strict=True))
    assert {s.master_addr for _, s in b_parts} == {addresses[b_first]}
    # The group's one transaction (after the holder's) read the new jobs'
    # rows and specs, and the chosen nodes' rows, from what it held: no
    # statement picks jobs or nodes by id, and the plan had no savepoint.
    assert written == [False, False]
    assert not [one for one in statements if "WHERE JOB.ID IN" in one]
    assert not [one for one in statements if "FROM NODE WHERE NODE.ID IN" in one]
    assert not [one for one in statements if "SAVEPOINT" in one]


def test_finishes_arriving_together_are_read_and_written_at_once_and_refusals_stand_apart(
    core: Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = join(core, "a"), join(core, "b")
    x, _ = jobs.submit_job(core, JobSpec(name="x"), ALICE)
    y, _ = jobs.submit_job(core, JobSpec(name="y"), ALICE)
    parts = {one.job_id: (node, one.part_id) for node in (a, b) for one in started(core, node)}
    assert set(parts) == {x, y}
    # Waits for both nodes: placed by the plan of the group that frees them.
    pair, _ = jobs.submit_job(core, JobSpec(name="pair", topology=Topology(num_machines=2)), ALICE)
    (x_node, x_part), (y_node, y_part) = parts[x], parts[y]
    result = TrainResult(test_accuracy=0.98, train_seconds=1.0)
    written = watch_savepoints(monkeypatch)
    calls: list[Callable[[], Any]] = [
        lambda: finish(core, x_node, x_part, status="succeeded", result=result),
        # Sent again in the same group: changes nothing.
        lambda: finish(core, x_node, x_part, status="succeeded", result=result),
        # Another node's part: refused, and the rest stand.
        lambda: finish(core, x_node, y_part, status="failed", exit_code=1),
        lambda: finish(core, y_node, y_part, status="succeeded"),
    ]
    answers, statements = one_group(core, calls)
    assert answers[0] is True and answers[1] is False and answers[3] is True
    assert isinstance(answers[2], Forbidden) and f"part {y_part}" in str(answers[2])
    assert read_job(db=core.db, job_id=x).result == result
    assert status(core, x) is JobStatus.SUCCEEDED and status(core, y) is JobStatus.SUCCEEDED
    assert status(core, pair) is JobStatus.RUNNING  # planned in the same transaction
    assert written == [False, False]
    # The four read their parts, jobs and attempts in one query, the
    # attempts' parts in another, and the two parts ended in one UPDATE.
    assert sum(s.startswith("SELECT PART.") and " JOIN JOB " in s for s in statements) == 1
    assert sum(s.startswith("UPDATE PART SET") for s in statements) == 1
