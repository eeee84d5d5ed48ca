"""Runs where teams look, with a real MLflow tracking server
(tests/mlflowserver.py) and real workers: a job appears as a run with its
spec as params, rank 0's reports as metrics, its result and its final
model; a script's own mlflow.log_metric lands in that run; the job's
TensorBoard event files read back to the values GET /jobs/{id}/metrics
gives."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from cli.cluster import LocalCluster
from tests.api.test_tracking import scalars
from tests.e2e.conftest import Jobs, worker_path
from tests.mlflowserver import MLflowServer


@pytest.fixture(scope="module")
def tracked(
    mnist_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    mlflow_server: MLflowServer,
    script_dir: Path,
) -> Iterator[tuple[LocalCluster, Path]]:
    logdir = tmp_path_factory.mktemp("tensorboard")
    with LocalCluster(
        state_dir=tmp_path_factory.mktemp("tracked"),
        data_dir=mnist_dir,
        workers=1,
        server_env={
            "DDPO_MLFLOW_TRACKING_URI": mlflow_server.url,
            "DDPO_MLFLOW_EXPERIMENT": "ddpo-e2e",
            "DDPO_TENSORBOARD_DIR": str(logdir),
        },
        extra_env=worker_path(),
        worker_args=["--script-dir", str(script_dir)],
    ) as cluster:
        yield cluster, logdir


def settled_run(mlflow_server: MLflowServer, job_id: int) -> Any:
    """The job's run, once the server has settled it (written off its
    request path: polled for, with a deadline)."""
    client = MlflowClient(mlflow_server.url)
    experiment = client.get_experiment_by_name("ddpo-e2e")
    deadline = time.monotonic() + 60
    while True:
        runs = (
            client.search_runs(
                [experiment.experiment_id], filter_string=f"tags.`ddpo.job_id` = '{job_id}'"
            )
            if experiment is not None
            else []
        )
        if len(runs) == 1 and runs[0].info.status != "RUNNING":
            return runs[0]
        assert len(runs) <= 1, runs
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id}'s run not settled: {runs}")
        time.sleep(0.5)
        experiment = experiment or client.get_experiment_by_name("ddpo-e2e")


def history(mlflow_server: MLflowServer, run: Any, name: str) -> list[tuple[int, float]]:
    found = MlflowClient(mlflow_server.url).get_metric_history(run.info.run_id, name)
    return sorted((m.step, m.value) for m in found)


@pytest.mark.timeout(300)
def test_a_job_is_an_mlflow_run_and_its_event_files_match_the_api(
    tracked: tuple[LocalCluster, Path], mlflow_server: MLflowServer
) -> None:
    cluster, logdir = tracked
    with cluster.client() as client:
        jobs = Jobs(client)
        job_id = jobs.submit(name="tracked-mnist", epochs=1, max_steps_per_epoch=40, seed=5)
        job = jobs.wait_done(job_id, 240)
        assert job["status"] == "succeeded", job
        metrics = client.get(f"/jobs/{job_id}/metrics").raise_for_status().json()
    run = settled_run(mlflow_server, job_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked-mnist"
    assert run.data.tags["ddpo.owner"] == job["owner"]
    params = run.data.params
    assert (params["trainer"], params["epochs"], params["seed"]) == ("mnist", "1", "5")
    assert params["topology.num_machines"] == "1" and params["batch_size"] == "128"
    mlflow = MlflowClient(mlflow_server.url)
    assert history(mlflow_server, run, "loss") == [
        (p["step"], pytest.approx(p["loss"])) for p in metrics["points"]
    ]
    assert run.data.metrics["result.test_accuracy"] == pytest.approx(job["result"]["test_accuracy"])
    (model,) = mlflow.list_artifacts(run.info.run_id, "model")
    assert model.path == f"model/job-{job_id}-epoch-1.pt"
    assert model.file_size == job["checkpoint"]["size_bytes"]
    # TensorBoard: the same reports, read back with its own reader.
    board = scalars(logdir / f"job-{job_id}")
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v, _ in board["loss"]] == [
        (p["step"], p["loss"]) for p in metrics["points"]
    ]
    assert set(board) == set(metrics["names"])


@pytest.mark.timeout(300)
def test_a_scripts_own_mlflow_calls_land_in_the_jobs_run(
    tracked: tuple[LocalCluster, Path], mlflow_server: MLflowServer
) -> None:
    cluster, _ = tracked
    with cluster.client() as client:
        jobs = Jobs(client)
        job_id = jobs.submit(script={"path": "tests/logs_to_mlflow.py"})
        job = jobs.wait_done(job_id, 240)
        assert job["status"] == "succeeded", job
    run = settled_run(mlflow_server, job_id)
    mlflow = MlflowClient(mlflow_server.url)
    script = sorted(
        (m.step, m.value) for m in mlflow.get_metric_history(run.info.run_id, "script_metric")
    )
    assert script == [(1, 2.0), (2, 4.0), (3, 6.0)]
    # ... beside ddpo's own reports of the same job.
    loss = sorted((m.step, m.value) for m in mlflow.get_metric_history(run.info.run_id, "loss"))
    assert loss == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert run.data.params["script.path"] == "tests/logs_to_mlflow.py"
