"""What a placed job costs the database's one writer: the core's commands
called in this process (no HTTP, no simulated fleet), on SQLite or a
PostgreSQL database made for the run, with thousands of live nodes.

    python -m bench.placement_writes --nodes 5000 \\
        --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres

``--submitters`` threads submit ``--jobs`` one-machine jobs; each job's
part is reported started and succeeded from a pool of other threads, as
nodes would. Prints jobs a second and, for each kind of write (a group of
submits and finishes written together with the plan they ask for, a node's
started), how many there were, how many statements they sent the
database for each placed job (a round trip each), and how long each held
its transaction open: the time that, summed over the kinds that take the write lock,
bounds jobs a second (on PostgreSQL a node's "started" is written beside
the lock holder, its part locked).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from sqlalchemy import event
from sqlmodel import Session, col, func, select

from api.core.context import Core
from api.core.jobs import submit_job
from api.core.people import Actor
from api.core.reports import finish_part, part_started
from api.settings import ServerSettings
from bench.control_plane import fresh_postgres
from db.engine import Database
from db.models import Job, Node, Part
from ddpo.lifecycle import JobStatus, NodeState, PartStatus
from ddpo.schemas import JobSpec
from ddpo.schemas.protocol import PartFinished

# The functions whose writes are told apart (the innermost on the stack).
KINDS = ("_write_group", "part_started")
DEADLINE_S = 300.0


class WriteTimes:
    """How long each write transaction stayed open, and how many statements
    it sent the database, by the kind of write."""

    def __init__(self, db: Database) -> None:
        self.held: dict[str, list[float]] = defaultdict(list)
        self.statements: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._writing = threading.local()
        write = db.write

        @contextmanager
        def timed(**options: Any) -> Iterator[Session]:
            kind = _kind()
            if not options.get("exclusive", True) and not db.is_sqlite:
                kind += " (beside the writer)"
            self._writing.kind = kind
            try:
                with write(**options) as session:
                    began = time.perf_counter()
                    yield session
            finally:
                self._writing.kind = None
            with self._lock:
                self.held[kind].append(time.perf_counter() - began)

        db.write = timed  # type: ignore[method-assign]
        event.listen(db.engine, "before_cursor_execute", self._sent)

    def _sent(self, *_: Any) -> None:
        kind = getattr(self._writing, "kind", None)
        if kind is not None:
            with self._lock:
                self.statements[kind] += 1


def _kind() -> str:
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name in KINDS:
            return frame.f_code.co_name
        frame = frame.f_back
    return "other"


def _parts(db: Database, where: Any) -> list[tuple[int, int]]:
    """(part id, node id) of the parts ``where`` picks."""
    with db.read() as session:
        return [(p.id or 0, p.node_id) for p in session.exec(select(Part).where(where)).all()]


def _succeeded(db: Database) -> int:
    with db.read() as session:
        statement = select(func.count()).select_from(Job).where(Job.status == JobStatus.SUCCEEDED)
        return int(session.exec(statement).one())


class Placing:
    """Submitters and the nodes' reports, on threads, as a server's are."""

    def __init__(self, core: Core, jobs: int, pool: ThreadPoolExecutor) -> None:
        self.core = core
        self.todo = list(range(jobs))
        self.lock = threading.Lock()
        self.pool = pool
        self.reports: list[Future[None]] = []

    def report(self, part_id: int, node_id: int) -> None:
        part_started(self.core, part_id, node_id)
        finished = PartFinished(node_id=node_id, status="succeeded", exit_code=0)
        finish_part(self.core, part_id, finished)

    def submitting(self) -> None:
        spec = JobSpec(max_steps_per_epoch=1)
        while True:
            with self.lock:
                if not self.todo:
                    return
                index = self.todo.pop()
            named = spec.model_copy(update={"name": f"j{index}"})
            job_id, _ = submit_job(self.core, named, Actor(name=None, role=None), f"k{index}")
            for part_id, node_id in _parts(self.core.db, col(Part.job_id) == job_id):
                self.reports.append(self.pool.submit(self.report, part_id, node_id))

    def reported_late(self) -> bool:
        """Jobs placed by a later plan than their submit's: their nodes
        report too. False if none was waiting."""
        late = _parts(self.core.db, col(Part.status) == PartStatus.ASSIGNED)
        self.reports.extend(self.pool.submit(self.report, *part) for part in late)
        return bool(late)


def run(database_url: str, nodes: int, jobs: int, submitters: int) -> None:
    settings = ServerSettings(database_url=database_url, heartbeat_timeout_s=3600)
    db = Database(database_url)
    db.prepare_schema()
    core = Core(db, settings)
    with db.write() as session:
        for i in range(nodes):
            offers: list[dict[str, Any]] = [{"name": "mnist"}]
            session.add(
                Node(
                    name=f"n{i}",
                    address="127.0.0.1",
                    trainers=["mnist"],
                    trainer_offers=offers,
                    scripts={},
                    state=NodeState.LIVE,
                )
            )
    times = WriteTimes(db)
    done = 0
    with ThreadPoolExecutor(24) as pool:
        placing = Placing(core, jobs, pool)
        began = time.perf_counter()
        threads = [threading.Thread(target=placing.submitting) for _ in range(submitters)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        while time.perf_counter() - began < DEADLINE_S:
            for future in list(placing.reports):
                future.result()
            done = _succeeded(db)
            if done >= jobs:
                break
            if not placing.reported_late():
                time.sleep(0.05)
        took = time.perf_counter() - began
    db.dispose()
    backend = "SQLite" if db.is_sqlite else "PostgreSQL"
    print(f"{backend}, {nodes} nodes, {submitters} submitters: {done / took:.1f} jobs a second")
    print(
        "| write | count | median held | mean held | total | statements a placed job |\n"
        "|---|---|---|---|---|---|"
    )
    for kind, held in sorted(times.held.items(), key=lambda kv: -sum(kv[1])):
        print(
            f"| {kind} | {len(held)} | {1000 * statistics.median(held):.2f} ms | "
            f"{1000 * statistics.fmean(held):.2f} ms | {sum(held):.2f} s | "
            f"{times.statements[kind] / max(done, 1):.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--submitters", type=int, default=16)
    parser.add_argument("--postgres-url", help="a database is made on it for the run")
    args = parser.parse_args()
    if args.postgres_url:
        with fresh_postgres(args.postgres_url) as url:
            run(url, args.nodes, args.jobs, args.submitters)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            run(f"sqlite:///{Path(tmp) / 'ddpo.db'}", args.nodes, args.jobs, args.submitters)


if __name__ == "__main__":
    main()
