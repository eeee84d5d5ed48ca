"""What stopping a job at a step costs, on a real server with three real
workers training real 2 x 1 gloo jobs on MNIST, round after round:

- preemption: a priority-10 job arrives while a priority-0 job runs on the
  two nodes it needs; from its submit to its start, the steps the victim
  lost (trained but not in its checkpoint), and the victim's stop (asked to
  stopped);
- drain: ``POST /nodes/{id}/drain`` (deadline 0) on machine 1's node; from
  the call to the job running again on the other two nodes;
- growth: an elastic job (1 to 3 machines) runs on two nodes, the third
  drained; ``POST /nodes/{id}/undrain``; from the call to the job training
  on three (the server's resize interval set to 0: the figure is the stop
  at a step, the checkpoint and the new start, not the wait between
  resizes, which is DDPO_RESIZE_INTERVAL_S).

    python -m bench.preemption --rounds 5 --data-dir ../shared/data

Figures come from the server's own timestamps (GET /jobs/{id}).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from cli.cluster import LocalCluster

VICTIM = {
    "topology": {"num_machines": 2, "num_processes": 1},
    "epochs": 1,
    "batch_size": 64,
    "max_steps_per_epoch": 400,
}
PREEMPTOR = {**VICTIM, "max_steps_per_epoch": 10, "priority": 10}


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def wait(client: httpx.Client, job_id: int, until: Callable[[dict[str, Any]], bool]) -> Any:
    deadline = time.monotonic() + 300
    while True:
        job = client.get(f"/jobs/{job_id}").raise_for_status().json()
        if until(job):
            return job
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job_id} is stuck: {job}")
        time.sleep(0.1)


def at_step(client: httpx.Client, step: int) -> dict[str, Any]:
    job_id = client.post("/jobs", json=VICTIM).raise_for_status().json()["id"]
    return wait(  # type: ignore[no-any-return]
        client,
        job_id,
        lambda j: j["status"] == "running" and ((j["progress"] or {}).get("batch") or 0) >= step,
    )


def ended(job: dict[str, Any]) -> bool:
    return job["status"] in ("succeeded", "failed", "cancelled")


def preemption_round(client: httpx.Client) -> dict[str, float]:
    victim = at_step(client, 30)
    preemptor = client.post("/jobs", json=PREEMPTOR).raise_for_status().json()
    started = wait(client, preemptor["id"], lambda j: j["timing"]["started_at"] is not None)
    wait(client, preemptor["id"], ended)
    stopped = wait(client, victim["id"], lambda j: len(j["attempts"]) == 2)
    first, second = stopped["attempts"]
    client.post(f"/jobs/{victim['id']}/cancel").raise_for_status()
    wait(client, victim["id"], ended)
    return {
        "submit_to_start_s": (
            at(started["timing"]["started_at"]) - at(started["timing"]["created_at"])
        ).total_seconds(),
        "stop_s": (at(first["finished_at"]) - at(first["stop"]["requested_at"])).total_seconds(),
        "steps_lost": first["stopped_at_step"] - (second["resumed_from_step"] or 0),
    }


def drain_round(client: httpx.Client) -> dict[str, float]:
    job = at_step(client, 30)
    node_id = next(p["node_id"] for p in job["parts"] if p["machine_id"] == 1)
    asked = time.monotonic()
    client.post(f"/nodes/{node_id}/drain", json={"deadline_s": 0}).raise_for_status()
    moved = wait(
        client,
        job["id"],
        lambda j: len(j["attempts"]) == 2 and all(p["status"] == "running" for p in j["parts"]),
    )
    took = time.monotonic() - asked
    first, second = moved["attempts"]
    client.post(f"/nodes/{node_id}/undrain").raise_for_status()
    client.post(f"/jobs/{job['id']}/cancel").raise_for_status()
    wait(client, job["id"], ended)
    return {
        "drain_to_running_again_s": took,
        "steps_lost": first["stopped_at_step"] - (second["resumed_from_step"] or 0),
    }


ELASTIC = {
    **VICTIM,
    "topology": {"num_machines": {"min": 1, "max": 3}, "num_processes": 1},
    "checkpoint_every_steps": 20,
}


def growth_round(client: httpx.Client) -> dict[str, float]:
    spare = client.get("/nodes").raise_for_status().json()["data"][-1]["id"]
    client.post(f"/nodes/{spare}/drain", json={"deadline_s": 0}).raise_for_status()
    job_id = client.post("/jobs", json=ELASTIC).raise_for_status().json()["id"]
    wait(
        client,
        job_id,
        lambda j: j["status"] == "running" and ((j["progress"] or {}).get("batch") or 0) >= 30,
    )
    asked = time.monotonic()
    client.post(f"/nodes/{spare}/undrain").raise_for_status()
    grown = wait(
        client,
        job_id,
        lambda j: (
            len(j["attempts"]) == 2
            and len(j["parts"]) == 3
            and all(p["status"] == "running" for p in j["parts"])
            and j["progress"] is not None
        ),
    )
    took = time.monotonic() - asked
    first, second = grown["attempts"]
    assert (first["world_size"], second["world_size"]) == (2, 3), grown["attempts"]
    client.post(f"/jobs/{job_id}/cancel").raise_for_status()
    wait(client, job_id, ended)
    return {
        "undrain_to_training_on_3_s": took,
        "steps_lost": first["stopped_at_step"] - (second["resumed_from_step"] or 0),
    }


def summary(name: str, rounds: list[dict[str, float]]) -> None:
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        print(
            f"{name:<11} {key:<26} median {statistics.median(values):8.2f}  "
            f"min {min(values):8.2f}  max {max(values):8.2f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(
            state_dir=Path(tmp),
            data_dir=args.data_dir.resolve(),
            workers=3,
            server_env={"DDPO_PREEMPTION_MIN_RUN_S": "0", "DDPO_RESIZE_INTERVAL_S": "0"},
        ) as cluster,
        httpx.Client(base_url=cluster.url, timeout=30, headers=cluster.headers("admin")) as client,
    ):
        preempted = [preemption_round(client) for _ in range(args.rounds)]
        drained = [drain_round(client) for _ in range(args.rounds)]
        grown = [growth_round(client) for _ in range(args.rounds)]
    summary("preemption", preempted)
    summary("drain", drained)
    summary("growth", grown)


if __name__ == "__main__":
    main()
