"""The prune's hold on each job's log lines (api/core/retention.py): a job
active or ended lately keeps only its newest ``max_log_lines_per_job``
lines, found for every such job in one statement."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlmodel import col, select

from api.core import retention
from api.core.context import Core
from api.settings import ServerSettings
from db import queries
from db.engine import Database
from db.models import LogRow, utcnow
from ddpo.lifecycle import JobStatus
from ddpo.schemas import JobSpec
from tests.databases import fresh_database_url

CAP = 5


@pytest.fixture
def core(tmp_path: Path) -> Iterator[Core]:
    db = Database(fresh_database_url(tmp_path, "retention"))
    db.prepare_schema()
    settings = ServerSettings(
        database_url=db.url, artifacts_dir=tmp_path / "artifacts", max_log_lines_per_job=CAP
    )
    try:
        yield Core(db, settings)
    finally:
        db.dispose()


def a_job_with_lines(core: Core, count: int, ended_ago: timedelta | None) -> int:
    """A job with ``count`` log lines; ended that long ago (None: running)."""
    now = utcnow()
    with core.db.write() as session:
        job = queries.insert_job(session=session, spec=JobSpec(), name=None)
        assert job.id is not None
        attempt = queries.insert_attempt(
            session=session,
            job_id=job.id,
            number=1,
            master_addr="127.0.0.1",
            num_machines=1,
            resumed_from_epoch=None,
            resumed_from_step=None,
        )
        assert attempt.id is not None
        if ended_ago is None:
            job.status = JobStatus.RUNNING
        else:
            job.status, job.finished_at = JobStatus.SUCCEEDED, now - ended_ago
        queries.insert_logs(
            session=session,
            job_id=job.id,
            attempt_id=attempt.id,
            machine_id=0,
            lines=[(0, i, f"line {i}", now) for i in range(count)],
        )
        return job.id


def kept(core: Core, job_id: int) -> list[str]:
    with core.db.read() as session:
        rows = session.exec(
            select(LogRow).where(LogRow.job_id == job_id).order_by(col(LogRow.id))
        ).all()
        return [row.text for row in rows]


def test_a_prune_cuts_each_recent_job_to_its_newest_lines_in_a_few_statements(
    core: Core,
) -> None:
    # Lines written past the cap (a cap lowered since, or inserts that
    # outran it): the prune catches them up.
    running = a_job_with_lines(core, 12, ended_ago=None)
    ended_lately = a_job_with_lines(core, 8, ended_ago=timedelta(minutes=5))
    small = [a_job_with_lines(core, 3, ended_ago=None) for _ in range(20)]
    long_ended = a_job_with_lines(core, 9, ended_ago=timedelta(hours=3))
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(core.db.engine, "before_cursor_execute", count)
    pruned = retention.prune(core, utcnow())
    event.remove(core.db.engine, "before_cursor_execute", count)

    assert kept(core, running) == [f"line {i}" for i in range(7, 12)]
    assert kept(core, ended_lately) == [f"line {i}" for i in range(3, 8)]
    assert all(kept(core, job_id) == ["line 0", "line 1", "line 2"] for job_id in small)
    # Its lines go with the log retention's days, not the cap's catch-up.
    assert len(kept(core, long_ended)) == 9
    assert pruned.log_lines == 7 + 3
    # One statement finds the two jobs over the cap, then two for each (its
    # newest line to drop, the delete); none for the 20 under it.
    on_lines = [s for s in statements if "log_line" in s]
    assert len(on_lines) == 1 + 2 * 2, on_lines


def test_lines_written_or_pruned_in_bulk_count_as_writes_to_their_table(core: Core) -> None:
    """No flush sees these statements' rows, yet a cached read of a job's
    lines (api/read_cache.py) is stale once they commit: the insert and the
    prune count as a write to the log table, as a flush would."""
    (before,) = core.db.writes_to((LogRow,))
    job_id = a_job_with_lines(core, 2 * CAP, ended_ago=None)
    (inserted,) = core.db.writes_to((LogRow,))
    assert inserted == before + 1
    assert retention.prune(core, utcnow()).log_lines == CAP
    assert kept(core, job_id) == [f"line {i}" for i in range(CAP, 2 * CAP)]
    (pruned,) = core.db.writes_to((LogRow,))
    assert pruned == inserted + 1
    # A prune with nothing to drop changes nothing.
    assert retention.prune(core, utcnow()).log_lines == 0
    assert core.db.writes_to((LogRow,)) == (pruned,)
