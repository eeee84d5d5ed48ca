"""What holding a job to its log cap on insert costs: one batch of log
lines inserted, with and without dropping the job's oldest lines beyond the
cap in the same transaction, for a job already at its cap (the case a
flood or a long run reaches), alternated on one SQLite file.

    python -m bench.log_cap --rounds 5 --cap 200000 --batch 2000

Prints milliseconds per batch for each and the difference: what a node's
log report pays for a cap no writer can outrun.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from db import migrate, queries
from db.engine import Database
from ddpo.schemas import JobSpec

AT = datetime(2026, 12, 1, tzinfo=timezone.utc)


def _lines(first: int, count: int) -> list[tuple[int, int, str, datetime]]:
    return [
        (0, 100 * i, f"epoch 1 batch {i}: loss 0.{i % 1000:03d}", AT)
        for i in range(first, first + count)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cap", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        db = Database(f"sqlite:///{Path(folder) / 'bench.db'}")
        migrate.prepare(db.engine)
        with db.write() as session:
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
            job_id, attempt_id = job.id, attempt.id
            assert attempt_id is not None
        next_line = 0
        for first in range(0, args.cap, 10_000):
            with db.write() as session:
                queries.insert_logs(
                    session=session,
                    job_id=job_id,
                    attempt_id=attempt_id,
                    machine_id=0,
                    lines=_lines(first, 10_000),
                )
            next_line = first + 10_000
        times: dict[str, list[float]] = {"insert alone": [], "insert and hold the cap": []}
        for _ in range(args.rounds):
            for label in times:
                started = time.perf_counter()
                with db.write() as session:
                    queries.insert_logs(
                        session=session,
                        job_id=job_id,
                        attempt_id=attempt_id,
                        machine_id=0,
                        lines=_lines(next_line, args.batch),
                    )
                    if label != "insert alone":
                        queries.delete_logs_beyond(
                            session=session, job_id=job_id, keep=args.cap, limit=args.batch + 5000
                        )
                times[label].append((time.perf_counter() - started) * 1000)
                next_line += args.batch
        for label, ms in times.items():
            print(f"{label:<24} {statistics.median(ms):7.1f} ms per {args.batch} lines (median)")
        extra = statistics.median(times["insert and hold the cap"]) - statistics.median(
            times["insert alone"]
        )
        print(f"{'the cap costs':<24} {extra:7.1f} ms per batch at {args.cap:,} lines kept")
        db.engine.dispose()


if __name__ == "__main__":
    main()
