"""performance.precision on real workers: a bf16-mixed job of the built-in
trainer across two ranks, and a script's ddpo.autocast following the job's
precision. (How fast each precision trains is measured in bench/, never
here.)"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Jobs
from worker import cpu_features


# Emulated (a CPU without bfloat16 instructions) the job takes about 110 s
# on two cores rather than 15.
@pytest.mark.timeout(450)
def test_a_bf16_mixed_job_trains_and_says_its_precision(jobs: Jobs) -> None:
    slow = cpu_features.slow_precision("bf16-mixed", "gloo", cpu_features.flags())
    job_id = jobs.submit(
        processes=2,
        batch_size=64,
        max_steps_per_epoch=120,
        performance={"precision": "bf16-mixed"},
    )
    job = jobs.wait_done(job_id, timeout_s=180 if slow is None else 400)
    assert job["status"] == "succeeded", job["error"]
    result = job["result"]
    assert result["precision"] == "bf16-mixed"
    # 120 steps of 128 images learn MNIST in bfloat16 as in fp32 (~95%).
    assert result["test_accuracy"] > 0.9, result
    # Where this CPU has no bfloat16 instructions, the job's log says so
    # (emulated, they are far slower than fp32); where it has them, nothing.
    lines = jobs.client.get(f"/jobs/{job_id}/logs").raise_for_status().json()["lines"]
    said = [line["text"] for line in lines if line["text"].startswith("performance.precision")]
    assert said == ([slow] if slow is not None else []), said


def test_a_scripts_autocast_runs_in_the_jobs_precision(jobs: Jobs) -> None:
    said = {}
    for precision in ("bf16-mixed", "fp32"):
        job_id = jobs.submit(
            script={
                "path": "torchrun_mlp.py",
                "args": ["--epochs", "1", "--steps-per-epoch", "10"],
            },
            performance={"precision": precision},
        )
        job = jobs.wait_done(job_id, timeout_s=120)
        assert job["status"] == "succeeded", job["error"]
        lines = jobs.client.get(f"/jobs/{job_id}/logs").raise_for_status().json()["lines"]
        said[precision] = [line["text"] for line in lines if line["text"].startswith("precision")]
    assert said == {
        "bf16-mixed": ["precision bf16-mixed: logits in torch.bfloat16"],
        "fp32": ["precision fp32: logits in torch.float32"],
    }
