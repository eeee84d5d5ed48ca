"""Sweeps on real workers: every trial a DDP job on the queue, the poor ones
stopped at a step by ASHA while the rest train on; a plugin's params and a
script's arguments swept the same way."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

import ddpo
from cli.cluster import LocalCluster
from tests.e2e.conftest import Jobs, rank_processes, record, until

# Three short epochs: ASHA's rungs (grace 10, reduction 3) at steps 10, 30 and 90.
EPOCHS, STEPS = 3, 40
LAST_STEP = EPOCHS * STEPS


def wait_sweep(client: httpx.Client, sweep_id: int, timeout_s: float) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        sweep: dict[str, Any] = client.get(f"/sweeps/{sweep_id}").raise_for_status().json()
        return sweep if sweep["status"] in ("succeeded", "failed", "cancelled") else None

    return until(ended, timeout_s, f"sweep {sweep_id} to end")


def test_asha_prunes_poor_learning_rates_and_the_best_beats_the_default(
    cluster: LocalCluster, jobs: Jobs
) -> None:
    spec = {"epochs": EPOCHS, "max_steps_per_epoch": STEPS, "batch_size": 64}
    body = {
        "name": "lr",
        "spec": spec,
        "space": {"lr": {"type": "float", "low": 0.01, "high": 5, "log": True}},
        "objective": {"metric": "train_loss", "direction": "minimize"},
        "max_trials": 12,
        "max_concurrent": 2,
        "sampler": {"kind": "random", "seed": 1},
        "pruner": {"kind": "asha", "reduction_factor": 3, "grace_steps": 10},
    }
    created = jobs.client.post("/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep = wait_sweep(jobs.client, created.json()["id"], 600)
    default = jobs.wait_done(jobs.submit(**spec), timeout_s=180)
    assert default["status"] == "succeeded"

    trials = sweep["trials"]
    assert sweep["status"] == "succeeded" and len(trials) == 12
    assert [t["number"] for t in trials] == list(range(12))
    pruned = [t for t in trials if t["state"] == "pruned"]
    assert len(pruned) >= 4, [(t["params"], t["state"]) for t in trials]  # a third or more
    for trial in pruned:
        assert trial["pruned_at_step"] < LAST_STEP and trial["step"] < LAST_STEP
        job = jobs.get(trial["job_id"])
        assert job["status"] == "cancelled" and job["error"] is None
        assert job["attempts"][-1]["ended"].startswith("pruned (sweep")
        assert job["checkpoint"] is not None  # it stopped at a step, checkpointed
    finished = [t for t in trials if t["state"] == "succeeded"]
    assert all(t["step"] == LAST_STEP for t in finished)
    assert {t["state"] for t in trials} == {"pruned", "succeeded"}

    best = sweep["best"]
    best_trial = trials[best["number"]]
    assert best["value"] == min(t["value"] for t in finished)
    default_accuracy = default["result"]["test_accuracy"]
    assert best_trial["test_accuracy"] >= default_accuracy
    # Steps trained: pruning saved what the pruned trials did not train.
    trained = sum(t["step"] for t in trials)
    assert trained < 12 * LAST_STEP
    record(
        "ASHA sweep over lr, 12 trials, 2 at a time",
        pruned=len(pruned),
        steps_trained=trained,
        steps_unpruned=12 * LAST_STEP,
        slot_seconds=sweep["slot_seconds"],
        best_lr=best["params"]["lr"],
        best_test_accuracy=best_trial["test_accuracy"],
        default_test_accuracy=default_accuracy,
    )


def test_a_sweep_over_a_plugins_params(cluster: LocalCluster, jobs: Jobs) -> None:
    body = {
        "spec": {"trainer": "charlm", "epochs": 2, "params": {"steps_per_epoch": 20}},
        "space": {
            "params.learning_rate": {"type": "float", "low": 0.001, "high": 0.1, "log": True},
            "params.hidden": {"type": "categorical", "choices": [32, 128]},
        },
        "objective": {"metric": "loss"},
        "max_trials": 4,
        "max_concurrent": 2,
        "sampler": {"kind": "tpe", "seed": 3},
        "pruner": {"kind": "median", "startup_trials": 2},
    }
    # A name the trainer's schema (as its nodes declare it) does not have.
    typo = {**body, "space": {"params.hiden": {"type": "int", "low": 8, "high": 64}}}
    refused = jobs.client.post("/sweeps", json=typo)
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"][-2:] == ["space", "params.hiden"]
    created = jobs.client.post("/sweeps", json=body)
    assert created.status_code == 201, created.text

    async def waited() -> dict[str, Any]:  # as an asyncio program would
        assert cluster.tokens is not None
        async with ddpo.AsyncClient(cluster.url, cluster.tokens.read) as client:
            done = await client.wait_sweep(created.json()["id"], timeout_s=300, poll_s=0.5)
            return done.model_dump(mode="json")

    sweep = asyncio.run(waited())
    assert sweep["status"] == "succeeded"
    assert len(sweep["trials"]) == 4
    for trial in sweep["trials"]:
        assert trial["state"] in ("succeeded", "pruned")
        params = jobs.get(trial["job_id"])["spec"]["params"]
        assert params["learning_rate"] == trial["params"]["params.learning_rate"]
        assert params["hidden"] == trial["params"]["params.hidden"]
        assert params["steps_per_epoch"] == 20  # the base spec's, kept
        assert trial["values"], "no reports of the objective"
    assert sweep["best"] is not None


def test_a_sweep_over_a_scripts_arguments(cluster: LocalCluster, jobs: Jobs) -> None:
    base_args = ["--epochs", "1", "--steps-per-epoch", "20", "--step-seconds", "0"]
    body = {
        "spec": {"script": {"path": "torchrun_mlp.py", "args": base_args}},
        "space": {
            "args.lr": {"type": "float", "low": 0.01, "high": 0.5, "log": True},
            "args.hidden": {"type": "categorical", "choices": [16, 64]},
        },
        "objective": {"metric": "accuracy", "direction": "maximize"},
        "max_trials": 3,
        "max_concurrent": 2,
        "sampler": {"kind": "random", "seed": 5},
    }
    # Through the client, as a script that drives the server would.
    assert cluster.tokens is not None
    with ddpo.Client(cluster.url, cluster.tokens.user) as client:
        submitted = client.submit_sweep(body)
        sweep = client.wait_sweep(submitted.id, timeout_s=300).model_dump(mode="json")
    assert sweep["status"] == "succeeded", sweep
    assert [t["state"] for t in sweep["trials"]] == ["succeeded"] * 3
    for trial in sweep["trials"]:
        job = jobs.get(trial["job_id"])
        args = job["spec"]["script"]["args"]
        lr, hidden = trial["params"]["args.lr"], trial["params"]["args.hidden"]
        assert args == [*base_args, "--lr", str(lr), "--hidden", str(hidden)]
        # The script's own reports of accuracy are the objective.
        assert trial["value"] == job["progress"]["metrics"]["accuracy"]
    best = max(sweep["trials"], key=lambda t: t["value"])
    assert sweep["best"]["number"] == best["number"]


def test_a_pruned_two_machine_trial_stops_on_both_machines_without_a_hang(
    cluster: LocalCluster, jobs: Jobs
) -> None:
    """Each trial spans both nodes: the pruned one's ranks agree on a step,
    checkpoint and end on both machines (the stop of ray_lightning#253's
    hang), and the sweep goes on."""
    body = {
        "spec": {
            "topology": {"num_machines": 2, "num_processes": 1},
            "epochs": 2,
            "max_steps_per_epoch": STEPS,
            "batch_size": 64,
        },
        # Seed 1: the grid's first point is lr 1.0, which trains well; 0.01 does not.
        "space": {"lr": {"type": "categorical", "choices": [1.0, 0.01]}},
        "objective": {"metric": "train_loss"},
        "max_trials": 2,
        "max_concurrent": 1,
        "sampler": {"kind": "grid", "seed": 1},
        "pruner": {"kind": "median", "startup_trials": 1},
    }
    created = jobs.client.post("/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep = wait_sweep(jobs.client, created.json()["id"], 300)
    first, second = sweep["trials"]
    assert (first["params"]["lr"], first["state"]) == (1.0, "succeeded")
    assert (second["params"]["lr"], second["state"]) == (0.01, "pruned"), second
    pruned = jobs.get(second["job_id"])
    assert [p["status"] for p in pruned["parts"]] == ["stopped", "stopped"]
    assert pruned["attempts"][0]["stopped_at_step"] < 2 * STEPS
    until(lambda: rank_processes(cluster) == [], 30, "every rank to have exited")
