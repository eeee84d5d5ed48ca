"""Sweeps over HTTP, with nodes spoken by hand: trials are ordinary jobs, a
poor one is asked to stop at a step (reason pruned) and its slot goes to
the next trial at once, the search goes on across a server restart, and a
bad space is a 422 naming the dimension."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import ProtocolNode, ThreadedServer, bearer, make_settings, wait_for

LR = {"lr": {"type": "float", "low": 0.01, "high": 5, "log": True}}


def sweep_body(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "spec": {"epochs": 1, "max_steps_per_epoch": 100},
        "space": LR,
        "objective": {"metric": "loss"},
        "max_trials": 6,
        "max_concurrent": 2,
        "sampler": {"kind": "random", "seed": 7},
        "pruner": {"kind": "asha", "reduction_factor": 2, "grace_steps": 10},
    }
    body.update(fields)
    return body


def get(client: httpx.Client, sweep_id: int) -> dict[str, Any]:
    found: dict[str, Any] = client.get(f"/sweeps/{sweep_id}").raise_for_status().json()
    return found


def report(
    client: httpx.Client, node: ProtocolNode, part_id: int, seq: int, step: int, loss: float
) -> None:
    body = {
        "node_id": node.node_id,
        "reports": [
            {
                "seq": seq,
                "epoch": 1,
                "batch": step,
                "batches_per_epoch": 100,
                "loss": loss,
                "at": "2026-01-01T00:00:00Z",
            }
        ],
    }
    client.post(f"/parts/{part_id}/progress", json=body).raise_for_status()


def started(client: httpx.Client, node: ProtocolNode) -> dict[int, int]:
    """job id -> part id of what the node is given now, each marked started."""
    parts = {}
    for start in node.poll()["start"]:
        client.post(f"/parts/{start['part_id']}/started", json={"node_id": node.node_id})
        parts[start["job_id"]] = start["part_id"]
    return parts


def test_trials_are_jobs_with_the_sweeps_values_owner_and_priority(client: httpx.Client) -> None:
    body = sweep_body(spec={"epochs": 1, "priority": 5}, name="lr")
    created = client.post("/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep = created.json()
    assert sweep["status"] == "running" and len(sweep["trials"]) == 2
    for trial in sweep["trials"]:
        job = client.get(f"/jobs/{trial['job_id']}").json()
        assert job["spec"]["lr"] == trial["params"]["lr"]
        assert 0.01 <= job["spec"]["lr"] <= 5
        assert job["priority"] == 5 and job["status"] == "queued"
        assert job["sweep_id"] == sweep["id"]
        assert job["name"] == f"lr: trial {trial['number']}"
    listed = {j["id"] for j in client.get("/jobs").json()["data"]}
    assert {t["job_id"] for t in sweep["trials"]} <= listed
    # The same seed asks the same values: the search is reproducible.
    again = client.post("/sweeps", json=body).json()
    assert [t["params"] for t in again["trials"]] == [t["params"] for t in sweep["trials"]]


def test_a_poor_trial_stops_at_a_step_and_its_slot_goes_to_the_next(client: httpx.Client) -> None:
    node = ProtocolNode(client, "n", slots=2)
    sweep = client.post("/sweeps", json=sweep_body()).json()
    parts = started(client, node)
    (_, good_part), (poor_job, poor_part) = sorted(parts.items())

    report(client, node, good_part, 0, 11, 0.5)
    report(client, node, poor_part, 0, 11, 2.0)  # worse at the first rung than the one before
    asked = node.poll(active=list(parts.values()))["checkpoint_and_stop"]
    assert [(a["part_id"], a["reason"]) for a in asked] == [(poor_part, "pruned")]
    trial = next(t for t in get(client, sweep["id"])["trials"] if t["job_id"] == poor_job)
    assert trial["state"] == "running" and trial["pruned_at_step"] == 11

    node.finish(poor_part, "stopped", exit_code=0, step=12).raise_for_status()
    now = get(client, sweep["id"])
    trial = next(t for t in now["trials"] if t["job_id"] == poor_job)
    assert trial["state"] == "pruned" and trial["job_status"] == "cancelled"
    assert trial["value"] == 2.0
    job = client.get(f"/jobs/{poor_job}").json()
    assert job["attempts"][0]["ended"].startswith(
        f"pruned (sweep {sweep['id']} trial 1 at step 11)"
    )
    assert job["error"] is None
    # The third trial was queued with the stop, and is placed at once.
    assert [t["number"] for t in now["trials"]] == [0, 1, 2]
    third = now["trials"][2]["job_id"]
    assert list(started(client, node)) == [third]

    node.finish(
        good_part, "succeeded", exit_code=0, result={"test_accuracy": 0.9}
    ).raise_for_status()
    done = get(client, sweep["id"])
    assert done["best"]["number"] == 0 and done["best"]["value"] == 0.5
    assert done["counts"]["pruned"] == 1 and done["counts"]["succeeded"] == 1
    actions = [e["action"] for e in client.get("/audit").json()["data"]]
    assert "sweep.prune" in actions and "sweep.submit" in actions
    scraped = client.get("/metrics").text
    assert 'ddpo_sweep_trials{state="pruned"} 1.0' in scraped
    assert 'ddpo_sweep_trials{state="succeeded"} 1.0' in scraped
    assert 'ddpo_stops_total{reason="pruned"} 1.0' in scraped


def test_the_last_trials_end_the_sweep_and_the_best_is_the_objectives(
    client: httpx.Client,
) -> None:
    node = ProtocolNode(client, "n", slots=1)
    body = sweep_body(
        max_trials=3,
        max_concurrent=1,
        objective={"metric": "test_accuracy", "direction": "maximize"},
        pruner={"kind": "none"},
    )
    sweep = client.post("/sweeps", json=body).json()
    accuracies = [0.91, 0.97, 0.95]
    for accuracy in accuracies:
        ((_, part),) = started(client, node).items()
        result = {"test_accuracy": accuracy}
        node.finish(part, "succeeded", exit_code=0, result=result).raise_for_status()
    done = get(client, sweep["id"])
    assert done["status"] == "succeeded" and done["finished_at"] is not None
    assert [t["value"] for t in done["trials"]] == accuracies
    assert done["best"]["number"] == 1 and done["best"]["value"] == 0.97
    assert started(client, node) == {}  # no fourth trial


def test_cancelling_a_sweep_cancels_its_trials_and_starts_no_more(client: httpx.Client) -> None:
    sweep = client.post("/sweeps", json=sweep_body()).json()
    cancelled = client.post(f"/sweeps/{sweep['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert {t["state"] for t in cancelled["trials"]} == {"cancelled"}
    assert len(cancelled["trials"]) == 2
    again = client.post(f"/sweeps/{sweep['id']}/cancel")
    assert again.status_code == 409
    assert again.json()["detail"] == f"sweep {sweep['id']} is already cancelled"
    assert client.get("/sweeps/999").status_code == 404


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"space": {"bogus": {"type": "int", "low": 1, "high": 2}}}, "bogus"),
        ({"space": {"lr": {"type": "float", "low": 0, "high": 1, "log": True}}}, "space.lr"),
        ({"space": {"lr": {"type": "float", "low": 0.1, "high": 2000}}}, "space.lr"),
        ({"space": {"batch_size": {"type": "int", "low": 0, "high": 8}}}, "space.batch_size"),
        ({"space": {"args.lr": {"type": "float", "low": 0.1, "high": 1}}}, "space.args.lr"),
        ({"space": {"lr": {"type": "log"}}}, "space.lr"),
        ({"max_trials": 0}, "max_trials"),
        ({"sampler": {"kind": "grid"}}, "space.lr"),
        ({"pruner": {"kind": "asha", "reduction_factor": 1}}, "pruner.reduction_factor"),
        ({"objective": {"metric": "a b"}}, "objective.metric"),
    ],
)
def test_a_bad_sweep_is_a_422_naming_the_field(
    client: httpx.Client, change: dict[str, Any], field: str
) -> None:
    response = client.post("/sweeps", json=sweep_body(**change))
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    said = detail if isinstance(detail, str) else str(detail)
    dotted = (
        [".".join(str(p) for p in e["loc"][1:]) for e in detail] if isinstance(detail, list) else []
    )
    assert field in said or field in dotted, said
    assert client.get("/sweeps").json()["data"] == []  # nothing stored


def test_a_param_outside_the_trainers_schema_is_a_422_naming_it(client: httpx.Client) -> None:
    schema = {
        "type": "object",
        "properties": {"hidden": {"type": "integer", "minimum": 8, "maximum": 512}},
        "additionalProperties": False,
    }
    ProtocolNode(client, "n", trainers=[{"name": "lm", "version": "1", "params_schema": schema}])
    base = {"trainer": "lm", "epochs": 1}
    unknown = sweep_body(spec=base, space={"params.hiden": {"type": "int", "low": 8, "high": 64}})
    response = client.post("/sweeps", json=unknown)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][-2:] == ["space", "params.hiden"]
    assert "not a parameter of this trainer" in response.json()["detail"][0]["msg"]
    too_big = sweep_body(
        spec=base, space={"params.hidden": {"type": "int", "low": 8, "high": 4096}}
    )
    response = client.post("/sweeps", json=too_big)
    assert response.status_code == 422
    assert "4096" in response.json()["detail"][0]["msg"]
    fine = sweep_body(spec=base, space={"params.hidden": {"type": "int", "low": 8, "high": 512}})
    created = client.post("/sweeps", json=fine).json()
    job = client.get(f"/jobs/{created['trials'][0]['job_id']}").json()
    assert 8 <= job["spec"]["params"]["hidden"] <= 512


def test_a_sweep_goes_on_after_a_restart_without_repeating_a_trial(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url) as client:
        node = ProtocolNode(client, "n", slots=2)
        sweep = client.post("/sweeps", json=sweep_body(pruner={"kind": "none"})).json()
        parts = started(client, node)
        first_numbers = [t["number"] for t in sweep["trials"]]
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url) as client:
        node.client = client
        for part in parts.values():
            node.finish(part, "succeeded", exit_code=0, result={"test_accuracy": 0.9})
        now = get(client, sweep["id"])
        assert first_numbers == [0, 1]
        assert [t["number"] for t in now["trials"]] == [0, 1, 2, 3]
        assert len({t["job_id"] for t in now["trials"]}) == 4
        # The values a fresh server asks are the ones the first would have.
        fresh = client.post("/sweeps", json=sweep_body(pruner={"kind": "none"})).json()
        assert [t["params"] for t in fresh["trials"]] == [t["params"] for t in now["trials"][:2]]


def test_only_the_owner_or_an_admin_cancels_a_sweep(tmp_path: Path) -> None:
    admin_token = "admin-" + "a" * 26
    settings = make_settings(tmp_path, admin_token=admin_token, user_token="user-" + "u" * 27)
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url) as http:
        keys = {}
        for name in ("ann", "bob"):
            made = http.post(
                "/keys", json={"name": name, "role": "user"}, headers=bearer(admin_token)
            )
            keys[name] = bearer(made.raise_for_status().json()["key"])
        sweep = http.post("/sweeps", json=sweep_body(), headers=keys["ann"]).json()
        assert sweep["owner"] == "ann"
        job = http.get(f"/jobs/{sweep['trials'][0]['job_id']}", headers=keys["ann"]).json()
        assert job["owner"] == "ann"
        refused = http.post(f"/sweeps/{sweep['id']}/cancel", headers=keys["bob"])
        assert refused.status_code == 403
        assert "only its owner or an admin" in refused.json()["detail"]
        assert http.post(f"/sweeps/{sweep['id']}/cancel", headers=keys["ann"]).status_code == 200
        entries = http.get("/audit", headers=bearer(admin_token)).json()["data"]
        assert [(e["action"], e["actor"]) for e in entries[:2]] == [
            ("sweep.cancel", "ann"),
            ("sweep.submit", "ann"),
        ]


def test_values_the_spec_refuses_together_end_the_sweep_saying_why(client: httpx.Client) -> None:
    """Each dimension's extremes are checked alone at submit; values that are
    fine alone but too much together (params over their 16 KiB) are found
    when the trial is made: at submit a 422, later the sweep ends failed,
    saying why, and no report that ended a trial fails."""
    node = ProtocolNode(client, "n", slots=1)
    one, two = "a" * 250, "b" * 250
    base = {"epochs": 1, "params": {"pad": "x" * 16_000}}
    space = {
        "params.a": {"type": "categorical", "choices": [one]},
        "params.b": {"type": "categorical", "choices": [two]},
    }
    refused = client.post("/sweeps", json=sweep_body(spec=base, space=space, max_concurrent=1))
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"][-1] == "space"
    assert "trial 0: params" in refused.json()["detail"][0]["msg"]
    assert client.get("/sweeps").json()["data"] == []

    # A second trial that cannot be made: the first ran, then the sweep ends.
    grown = {
        "params.a": {"type": "categorical", "choices": ["", one]},
        "params.b": space["params.b"],
    }
    # Seed 1: the grid's first point is the short value (api/sweeps.py seeds
    # the grid with the sweep's seed alone).
    grid = {"kind": "grid", "seed": 1}
    body = sweep_body(spec=base, space=grown, max_concurrent=1, sampler=grid, max_trials=2)
    created = client.post("/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep = created.json()
    assert [t["params"]["params.a"] for t in sweep["trials"]] == [""]
    ((_, part),) = started(client, node).items()
    node.finish(part, "succeeded", exit_code=0, result={"test_accuracy": 0.9}).raise_for_status()
    ended = get(client, sweep["id"])
    assert ended["status"] == "failed" and len(ended["trials"]) == 1
    assert ended["error"].startswith("trial 1: params"), ended["error"]


def test_a_trial_is_preempted_and_retried_like_any_job_and_stays_in_its_sweep(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path, poll_wait_s=0.0, preemption_min_run_s=0, retry_backoff_s=0.1)
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url) as client:
        preempted_then_retried(client)


def preempted_then_retried(client: httpx.Client) -> None:
    node = ProtocolNode(client, "n", slots=1)
    spec = {"epochs": 1, "max_restarts": 1}
    body = sweep_body(spec=spec, max_concurrent=1, max_trials=2, pruner={"kind": "none"})
    sweep = client.post("/sweeps", json=body).json()
    ((trial_job, part),) = started(client, node).items()
    report(client, node, part, 0, 11, 1.0)

    # A job of a higher priority takes the slot: the trial stops at a step
    # and goes back to the queue, still its sweep's running trial.
    urgent = client.post("/jobs", json={"priority": 10}).json()["id"]
    asked = node.poll(active=[part])["checkpoint_and_stop"]
    assert [(a["part_id"], a["reason"]) for a in asked] == [(part, "preempted")]
    node.finish(part, "stopped", exit_code=0, step=12).raise_for_status()
    assert client.get(f"/jobs/{trial_job}").json()["status"] == "queued"
    (trial,) = get(client, sweep["id"])["trials"]
    assert trial["state"] == "running" and trial["job_status"] == "queued"
    ((job_id, urgent_part),) = started(client, node).items()
    assert job_id == urgent
    node.finish(urgent_part, "succeeded", exit_code=0).raise_for_status()

    # Back on the node, it fails in a way a retry may fix: it is retried.
    ((job_id, part),) = started(client, node).items()
    assert job_id == trial_job
    node.finish(part, "failed", exit_code=-9, reason="rank_exited", message="killed")
    assert client.get(f"/jobs/{trial_job}").json()["status"] == "queued"

    def retried() -> dict[int, int]:
        return started(client, node)

    ((job_id, part),) = wait_for(retried, what="the retry").items()
    assert job_id == trial_job
    node.finish(part, "succeeded", exit_code=0, result={"test_accuracy": 0.9}).raise_for_status()
    done = get(client, sweep["id"])
    assert [t["state"] for t in done["trials"]] == ["succeeded", "queued"]
    job = client.get(f"/jobs/{trial_job}").json()
    assert [a["ended"].split(",")[0] for a in job["attempts"]] == [
        f"preempted by job {urgent}",
        "failed: rank_exited",
        "succeeded",
    ]


def test_a_failing_pruner_leaves_the_trial_training_and_the_report_taken(
    client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api import search

    def broken(*args: Any) -> tuple[int | None, dict[str, Any]]:
        raise RuntimeError("a pruner's bug")

    monkeypatch.setattr(search, "pruned_at", broken)
    node = ProtocolNode(client, "n", slots=2)
    sweep = client.post("/sweeps", json=sweep_body()).json()
    parts = started(client, node)
    for seq, (_, part) in enumerate(sorted(parts.items())):
        report(client, node, part, seq, 11, 0.5 + seq)  # raises if the report failed
    trials = get(client, sweep["id"])["trials"]
    assert [(t["state"], t["value"]) for t in trials] == [("running", 0.5), ("running", 1.5)]
    assert node.poll(active=list(parts.values()))["checkpoint_and_stop"] == []


def test_reports_where_the_pruner_cannot_decide_ask_it_nothing(
    client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A judgement reads every trial's rows in the writer: ASHA is asked
    only at a report that reaches a rung, a sweep without a pruner never,
    and the trial's values are kept either way."""
    from api import search

    asked: list[int] = []
    judge = search.pruned_at

    def counted(create: Any, trials: Any, number: int, steps: Any) -> Any:
        asked.append(number)
        return judge(create, trials, number, steps)

    monkeypatch.setattr(search, "pruned_at", counted)
    node = ProtocolNode(client, "n", slots=4)
    asha = client.post("/sweeps", json=sweep_body()).json()
    plain_sweep = client.post("/sweeps", json=sweep_body(pruner={"kind": "none"})).json()
    parts = started(client, node)
    trials = {t["job_id"]: t["number"] for t in asha["trials"]}
    asha_job, asha_part = next((job, part) for job, part in parts.items() if job in trials)
    plain = {job: part for job, part in parts.items() if job not in trials}
    for seq, step in enumerate([1, 4, 9]):  # below the first rung (grace_steps 10)
        report(client, node, asha_part, seq, step, 1.0)
        for part in plain.values():
            report(client, node, part, seq, step, 1.0)
    assert asked == []
    report(client, node, asha_part, 3, 11, 1.0)  # reaches the rung: judged there
    report(client, node, asha_part, 4, 12, 1.0)  # past it, short of the next (20)
    assert asked == [trials[asha_job]]
    kept = {
        t["job_id"]: t["value"]
        for sweep in (asha, plain_sweep)
        for t in get(client, sweep["id"])["trials"]
    }
    assert [kept[job] for job in (asha_job, *plain)] == [1.0] * 3
