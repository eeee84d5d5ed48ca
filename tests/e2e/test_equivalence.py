"""The same maths whatever the topology: 2 processes x batch 64 and 1
process x batch 128 see the same samples per step, so with dropout off and
the same seed they end with the same parameters (DDP averages the two
half-batch gradients into the full batch's)."""

from __future__ import annotations

import io

import torch

from tests.e2e.conftest import Jobs

STEPS = 8


def final_model(jobs: Jobs, job_id: int) -> dict[str, torch.Tensor]:
    job = jobs.wait_done(job_id)
    assert job["status"] == "succeeded", job["error"]
    assert job["checkpoint"]["epoch"] == 1
    response = jobs.client.get(f"/jobs/{job_id}/model")
    assert response.status_code == 200
    state: dict[str, torch.Tensor] = torch.load(io.BytesIO(response.content), weights_only=True)[
        "model"
    ]
    return state


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / a.norm())


# Float tolerance: summing a batch as two halves rounds differently, and
# Adadelta's normalisation carries that along (measured here: the largest
# element differences were ~1e-8 after 1 step and ~5e-6 after 8, on weights
# of ~0.1). A different seed differs by far more than 100x the tolerance.
TOLERANCE = 1e-4


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert relative_difference(a[name], b[name]) < TOLERANCE, name


def test_two_processes_of_64_train_what_one_of_128_trains(jobs: Jobs) -> None:
    common = {"trainer": "mnist-no-dropout", "seed": 3, "max_steps_per_epoch": STEPS}
    one = jobs.submit(machines=1, processes=1, batch_size=128, **common)
    two = jobs.submit(machines=1, processes=2, batch_size=64, **common)
    over_gloo = jobs.submit(
        machines=1,
        processes=2,
        batch_size=64,
        performance={"same_host_allreduce": "gloo"},
        **common,
    )
    across = jobs.submit(machines=2, processes=1, batch_size=64, **common)
    in_ddp = jobs.submit(
        machines=1,
        processes=1,
        batch_size=128,
        performance={"ddp_with_one_rank": True},
        **common,
    )
    reference = final_model(jobs, one)
    # One rank trains its module without DDP by default: DDP's average over
    # one rank is each gradient as it is, so the weights are the very same.
    wrapped = final_model(jobs, in_ddp)
    assert all(torch.equal(reference[n], wrapped[n]) for n in reference)
    assert_same(reference, final_model(jobs, two))  # gradients averaged in shared memory
    assert_same(reference, final_model(jobs, over_gloo))
    assert_same(reference, final_model(jobs, across))

    # The tolerance is not loose enough to let a different run pass.
    other = final_model(
        jobs, jobs.submit(machines=1, processes=1, batch_size=128, **{**common, "seed": 4})
    )
    assert all(relative_difference(reference[n], other[n]) > 100 * TOLERANCE for n in reference)
