"""What the CLI prints about a job: a script job is summarised by its script,
not by a trainer's epochs; the progress line says its loss and rate are one
batch's, and the summary that its figures are the epoch's and the job's."""

from __future__ import annotations

from typing import Any

from cli import render
from ddpo.schemas import JobPublic

AT = "2026-12-04T00:00:00Z"


def job(**spec: Any) -> JobPublic:
    return JobPublic.model_validate(
        {
            "id": 4,
            "name": None,
            "status": "running",
            "priority": 0,
            "spec": spec,
            "world_size": 2,
            "attempt": 1,
            "parts": [],
            "timing": {"created_at": AT},
            "progress": {
                "epoch": 1,
                "epochs": 1,
                "batch": 20,
                "batches_per_epoch": 40,
                "percent": 50.0,
                "loss": 0.25,
                "samples_per_sec": 1234.0,
                "updated_at": AT,
            },
            "result": {
                "test_accuracy": 0.98,
                "test_loss": 0.05,
                "train_loss": 0.2,
                "samples_per_sec": 1500.0,
            },
        }
    )


def test_a_script_jobs_summary_names_its_script_not_epochs() -> None:
    shown = render.summary(job(script={"path": "lm.py", "args": ["--steps", "40"]}))
    first = shown.splitlines()[0]
    assert "script lm.py --steps 40" in first, first
    assert "epoch" not in first, first


def test_a_trainer_jobs_summary_keeps_its_batch_and_epochs() -> None:
    first = render.summary(job(epochs=3, batch_size=64)).splitlines()[0]
    assert "batch 64/process, 3 epoch(s)" in first, first


def test_the_progress_line_and_summary_say_whose_loss_and_rate_they_are() -> None:
    running = job()
    line = render.progress_line(running)
    assert "batch loss 0.2500" in line and "batch rate 1,234 samples/s" in line, line
    shown = render.summary(running)
    assert "last epoch's mean train loss 0.2000" in shown, shown
    assert "throughput: 1,500 samples/s (the whole job" in shown, shown
