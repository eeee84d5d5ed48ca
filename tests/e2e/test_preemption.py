"""Preemption end to end (issue 28): real server, two real worker daemons,
real gloo process groups on the real MNIST files. A priority-0 2 x 1 job
runs; a priority-10 2 x 1 job arrives and needs both nodes. The first stops
at a step every rank agrees on, checkpoints there, and goes back to the
queue; the second runs; the first resumes from that step and ends with the
model a run never stopped ends with, every tensor equal."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import torch

from cli.cluster import LocalCluster
from tests.e2e.browser import ARTIFACTS, needs_a_browser, sign_in
from tests.e2e.conftest import Jobs, record
from tests.tensors import assert_same_tensors

# Long enough that the preemptor arrives mid-epoch, with room to spare.
VICTIM = {"epochs": 2, "batch_size": 64, "max_steps_per_epoch": 150, "seed": 5}
PREEMPTOR = {"epochs": 1, "batch_size": 64, "max_steps_per_epoch": 10, "priority": 10}


@pytest.fixture(scope="module")
def cluster(
    mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory, script_dir: Path
) -> Iterator[LocalCluster]:
    """Two single-slot nodes with the tests' scripts; a job may be
    preempted as soon as it runs."""
    with LocalCluster(
        state_dir=tmp_path_factory.mktemp("preemption"),
        data_dir=mnist_dir,
        workers=2,
        worker_args=["--script-dir", str(script_dir)],
        server_env={"DDPO_PREEMPTION_MIN_RUN_S": "0"},
    ) as running:
        yield running


@pytest.fixture
def jobs(cluster: LocalCluster) -> Iterator[Jobs]:
    with cluster.client("admin") as client:
        yield Jobs(client)


def model_of(jobs: Jobs, job_id: int) -> dict[str, Any]:
    response = jobs.client.get(f"/jobs/{job_id}/model")
    response.raise_for_status()
    state: dict[str, Any] = torch.load(io.BytesIO(response.content), weights_only=True)
    return state


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


@pytest.mark.timeout(420)
def test_a_higher_priority_job_preempts_and_the_victim_resumes_at_its_step_exactly(
    jobs: Jobs,
) -> None:
    victim = jobs.submit(machines=2, **VICTIM)
    jobs.wait(
        victim,
        lambda j: j["status"] == "running" and (j["progress"] or {}).get("batch", 0) >= 20,
        120,
        "the victim to train 20 steps",
    )
    submitted = time.monotonic()
    preemptor = jobs.submit(machines=2, **PREEMPTOR)
    waiting = jobs.get(preemptor)
    if waiting["status"] == "queued":
        assert waiting["pending"]["code"] == "preempting", waiting["pending"]
        assert waiting["pending"]["preempting"] == [victim]
        assert f"preempting job {victim} " in waiting["pending_reason"]

    started = jobs.wait(preemptor, lambda j: j["status"] != "queued", 120, "the preemptor to start")
    start_s = time.monotonic() - submitted
    assert started["status"] in ("running", "succeeded"), started
    stopped = jobs.get(victim)
    assert stopped["status"] == "queued", stopped
    first = stopped["attempts"][0]
    assert first["stop"]["reason"] == "preempted"
    assert first["stop"]["detail"] == f"by job {preemptor}"
    # It stopped at a step within the grace period, with a checkpoint there.
    assert at(first["finished_at"]) <= at(first["stop"]["deadline_at"])
    step = first["stopped_at_step"]
    assert step is not None and 20 <= step < VICTIM["max_steps_per_epoch"], first
    assert first["ended"] == f"preempted by job {preemptor}, stopped after step {step}"
    assert stopped["checkpoint"]["step"] == step and stopped["checkpoint"]["epoch"] == 0

    assert jobs.wait_done(preemptor, 120)["status"] == "succeeded"
    done = jobs.wait_done(victim, 240)
    assert done["status"] == "succeeded", done
    second = done["attempts"][1]
    assert second["resumed_from_step"] == step
    # The work lost: steps trained by the stopped attempt that its
    # checkpoint does not hold.
    lost = first["stopped_at_step"] - second["resumed_from_step"]
    assert 0 <= lost <= 1
    # max_restarts is 0: the stop used no restart.
    assert done["spec"]["max_restarts"] == 0 and len(done["attempts"]) == 2

    audit = jobs.client.get("/audit", params={"action": "job.preempt"}).json()["data"]
    assert any(
        e["target"] == f"job {victim}" and e["detail"]["by_job"] == preemptor for e in audit
    ), audit

    # The same job, never stopped, on the same topology.
    whole = jobs.wait_done(jobs.submit(machines=2, **VICTIM), 240)
    assert whole["status"] == "succeeded", whole
    compared = assert_same_tensors(model_of(jobs, whole["id"]), model_of(jobs, victim))
    assert compared >= 8  # every weight and bias, and the optimizer's state
    assert done["result"]["test_loss"] == whole["result"]["test_loss"]
    assert done["result"]["train_loss"] == whole["result"]["train_loss"]
    record(
        "preemption",
        submit_to_start_s=round(start_s, 2),
        stop_s=round(
            (at(first["finished_at"]) - at(first["stop"]["requested_at"])).total_seconds(), 2
        ),
        stopped_at_step=step,
        steps_lost=lost,
        tensors_equal=compared,
    )


def preempt(jobs: Jobs, victim: int, step: int) -> int:
    """Once the victim has reported ``step``, a priority-10 job that needs
    both nodes; the preemptor's id, once it has run to its end."""
    jobs.wait(
        victim,
        lambda j: j["status"] == "running" and ((j["progress"] or {}).get("step") or 0) >= step,
        120,
        f"the victim's step {step}",
    )
    preemptor = jobs.submit(machines=2, **PREEMPTOR)
    assert jobs.wait_done(preemptor, 180)["status"] == "succeeded"
    return preemptor


def counted(steps: int, *args: str) -> dict[str, Any]:
    return {"script": {"path": "tests/counts.py", "args": ["--steps", str(steps), *args]}}


@pytest.mark.timeout(300)
def test_a_script_that_asks_stops_at_its_step_and_resumes_from_it(jobs: Jobs) -> None:
    victim = jobs.submit(**counted(200, "--asks"))
    preemptor = preempt(jobs, victim, 10)
    done = jobs.wait_done(victim, 120)
    assert done["status"] == "succeeded", done
    first, second = done["attempts"]
    step = first["stopped_at_step"]
    assert step is not None and step >= 10, first
    assert first["ended"] == f"preempted by job {preemptor}, stopped after step {step}"
    assert second["resumed_from_step"] == step
    # No step was done twice or skipped.
    assert done["progress"]["metrics"]["total"] == 200 * 201 / 2
    lines = jobs.client.get(f"/jobs/{victim}/logs").json()["lines"]
    said = [line["text"] for line in lines]
    assert any(f"stopped after step {step}" in text for text in said), said
    assert any(f"resumed at step {step}" in text for text in said), said


@pytest.mark.timeout(300)
def test_a_script_that_never_asks_is_stopped_after_its_grace_and_resumes_from_its_checkpoint(
    jobs: Jobs,
) -> None:
    victim = jobs.submit(**counted(200, "--steps-per-epoch", "20"), stop_grace_s=1)
    preempt(jobs, victim, 30)
    done = jobs.wait_done(victim, 120)
    assert done["status"] == "succeeded", done
    first, second = done["attempts"]
    assert first["stopped_at_step"] is None
    # Stopped by signal once its grace was over, and none of max_restarts used.
    assert at(first["finished_at"]) > at(first["stop"]["deadline_at"])
    assert done["spec"]["max_restarts"] == 0
    assert second["resumed_from_epoch"] is not None and second["resumed_from_epoch"] >= 1
    assert second["resumed_from_step"] is None
    assert done["progress"]["metrics"]["total"] == 200 * 201 / 2


@needs_a_browser
@pytest.mark.timeout(300)
def test_the_dashboard_names_whom_a_job_preempts_and_why_each_attempt_ended(
    jobs: Jobs, cluster: LocalCluster, page: Any
) -> None:
    # A script that never asks, with 10 s to stop: long enough to see the
    # preemptor waiting on the queue page, and shorter than what is left of
    # its 400 steps (20 s), so it is stopped rather than done.
    victim = jobs.submit(**counted(400, "--steps-per-epoch", "20"), stop_grace_s=10)
    jobs.wait(
        victim,
        lambda j: ((j["progress"] or {}).get("step") or 0) >= 25,
        120,
        "the victim's first checkpoint",
    )
    preemptor = jobs.submit(machines=2, **PREEMPTOR)
    assert cluster.tokens is not None
    page.goto(f"{cluster.url}/ui/queue")
    sign_in(page, cluster, cluster.tokens.admin)
    row = page.locator(f"#queue tr[data-job='{preemptor}']")
    row.locator(".preempting").wait_for(timeout=10_000)
    assert row.locator(".preempting").inner_text() == f"preempting job {victim}"
    assert page.locator(f"#queue tr[data-job='{preemptor}'] .code").inner_text() == "preempting"
    page.screenshot(path=str(ARTIFACTS / "dashboard-preempting.png"), full_page=True)

    assert jobs.wait_done(preemptor, 120)["status"] == "succeeded"
    done = jobs.wait_done(victim, 120)
    assert done["status"] == "succeeded", done
    page.goto(f"{cluster.url}/ui/jobs/{victim}")
    page.locator("#attempts tr[data-attempt='2']").wait_for()
    first = page.inner_text("#attempts tr[data-attempt='1'] .ended")
    assert first == f"preempted by job {preemptor}", first
    resumed = page.inner_text("#attempts tr[data-attempt='2'] .resumed")
    epoch = done["attempts"][1]["resumed_from_epoch"]
    assert f"the checkpoint of epoch {epoch}" in resumed and "1 rank(s)" in resumed, resumed
    page.screenshot(path=str(ARTIFACTS / "dashboard-preempted-attempts.png"), full_page=True)
