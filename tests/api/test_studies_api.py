"""Scaling studies over HTTP: one job per row, run one after another."""

from __future__ import annotations

from typing import Any

import httpx

from tests.api.conftest import ProtocolNode


def study(client: httpx.Client, study_id: int) -> dict[str, Any]:
    result: dict[str, Any] = client.get(f"/studies/{study_id}").raise_for_status().json()
    return result


def test_the_default_study_is_the_recipes_table(client: httpx.Client) -> None:
    response = client.post("/studies", json={"spec": {"epochs": 1, "max_steps_per_epoch": 5}})
    assert response.status_code == 201
    created = response.json()
    assert created["status"] == "queued"
    rows = [(r["num_processes"], r["batch_size"], r["global_batch_size"]) for r in created["rows"]]
    assert rows == [(1, 128, 128), (2, 64, 128), (4, 32, 128), (8, 16, 128)]
    jobs = [client.get(f"/jobs/{r['job_id']}").json() for r in created["rows"]]
    assert all(j["spec"]["max_steps_per_epoch"] == 5 for j in jobs)


def test_rows_run_one_after_another(client: httpx.Client) -> None:
    node = ProtocolNode(client, "big", slots=4)
    rows = [{"num_processes": 1, "batch_size": 32}, {"num_processes": 2, "batch_size": 16}]
    created = client.post("/studies", json={"rows": rows}).json()
    first, second = (r["job_id"] for r in created["rows"])

    # The node has room for both, but only the first row starts.
    starts = node.poll()["start"]
    assert [s["job_id"] for s in starts] == [first]
    waiting = client.get(f"/jobs/{second}").json()
    assert waiting["status"] == "queued"
    assert waiting["pending_reason"] == f"study {created['id']}: waiting for job {first} to end"
    assert study(client, created["id"])["status"] == "running"

    node.finish(starts[0]["part_id"], "succeeded", exit_code=0).raise_for_status()
    assert [s["job_id"] for s in node.poll()["start"]] == [second]


def test_cancelling_a_study_cancels_every_row(client: httpx.Client) -> None:
    created = client.post("/studies", json={}).json()
    cancelled = client.post(f"/studies/{created['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert {r["status"] for r in cancelled["rows"]} == {"cancelled"}
    # As with a job: cancelling what has ended is a conflict, and says so.
    again = client.post(f"/studies/{created['id']}/cancel")
    assert again.status_code == 409
    assert again.json()["detail"] == f"study {created['id']} is already cancelled"


def test_bad_studies_get_422_naming_the_field(client: httpx.Client) -> None:
    for body, field in [
        ({"rows": []}, "rows"),
        ({"rows": [{"num_processes": 0, "batch_size": 8}]}, "rows.0.num_processes"),
        ({"rows": [{"num_machines": 64, "num_processes": 64, "batch_size": 8}]}, "rows.0"),
        ({"spec": {"backend": "mpi"}}, "spec.backend"),
        ({"rows": [{"num_processes": 1}]}, "rows.0.batch_size"),
    ]:
        response = client.post("/studies", json=body)
        assert response.status_code == 422, body
        assert any(d["msg"].startswith(f"{field}: ") for d in response.json()["detail"]), body
    assert client.get("/studies/99").status_code == 404
    assert client.post("/studies/99/cancel").status_code == 404
