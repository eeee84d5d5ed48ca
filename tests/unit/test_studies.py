from __future__ import annotations

from datetime import datetime, timedelta, timezone

from api.views import study_rows
from db.models import Job
from ddpo.lifecycle import JobStatus, study_status
from ddpo.schemas import JobSpec, Topology, TrainResult

J = JobStatus
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_study_status_follows_its_jobs() -> None:
    assert study_status([J.QUEUED, J.QUEUED]) is J.QUEUED
    assert study_status([J.SUCCEEDED, J.QUEUED]) is J.RUNNING
    assert study_status([J.RUNNING, J.QUEUED]) is J.RUNNING
    assert study_status([J.SUCCEEDED, J.SUCCEEDED]) is J.SUCCEEDED
    assert study_status([J.SUCCEEDED, J.FAILED]) is J.FAILED
    assert study_status([J.FAILED, J.CANCELLED]) is J.CANCELLED


def job(index: int, processes: int, train_seconds: float | None) -> Job:
    spec = JobSpec(topology=Topology(num_processes=processes), batch_size=128 // processes)
    result = TrainResult(train_seconds=train_seconds) if train_seconds else None
    return Job(
        id=index + 1,
        spec=spec,
        status=J.SUCCEEDED if train_seconds else J.QUEUED,
        study_index=index,
        started_at=NOW if train_seconds else None,
        finished_at=NOW + timedelta(seconds=(train_seconds or 0) + 2) if train_seconds else None,
        result=result,
    )


def test_speedup_and_efficiency_are_against_the_first_row() -> None:
    rows = study_rows([job(0, 1, 20.0), job(1, 2, 10.0), job(2, 4, 8.0), job(3, 8, None)], NOW)
    assert [r.speedup for r in rows] == [1.0, 2.0, 2.5, None]
    assert [r.efficiency for r in rows] == [1.0, 1.0, 0.625, None]
    assert [r.global_batch_size for r in rows] == [128, 128, 128, 128]
    assert rows[1].wall_seconds == 12.0 and rows[3].wall_seconds is None


def test_study_rows_from_the_command_line_may_vary_the_machines() -> None:
    import argparse

    from cli import studies

    parser = argparse.ArgumentParser()
    studies.add_arguments(parser)
    args = parser.parse_args(
        ["--rows", "1x1:128", "1x2:64", "2x1:64", "2x2:32", "4:16", "--machines", "3"]
    )
    rows = studies.study_request(args)["rows"]
    assert rows == [
        {"num_machines": 1, "num_processes": 1, "batch_size": 128},
        {"num_machines": 1, "num_processes": 2, "batch_size": 64},
        {"num_machines": 2, "num_processes": 1, "batch_size": 64},
        {"num_machines": 2, "num_processes": 2, "batch_size": 32},
        {"num_machines": 3, "num_processes": 4, "batch_size": 16},
    ]
