"""Priorities: queued jobs are tried higher first, first in, first out within
a priority, and a queued job's priority can change (PATCH /jobs/{id})."""

from __future__ import annotations

import httpx
import pytest

from cli.__main__ import main as cli
from tests.api.conftest import ProtocolNode, ThreadedServer
from tests.api.test_jobs_api import submit
from tests.api.test_retries import started


def run_next(node: ProtocolNode, running_part: int) -> tuple[int, int]:
    """Finish the part the node runs; the (job, part) it is given next."""
    node.finish(running_part, "succeeded", exit_code=0).raise_for_status()
    assignment = started(node)
    return assignment["job_id"], assignment["part_id"]


def test_higher_priorities_start_first_and_a_raised_job_moves_up(client: httpx.Client) -> None:
    node = ProtocolNode(client, "the-only-node")  # one slot
    first = submit(client)
    part = started(node)["part_id"]
    low = submit(client)
    later_low = submit(client)
    high = submit(client, priority=5)
    assert [job["status"] for job in (low, later_low, high)] == ["queued"] * 3
    assert high["priority"] == 5 and low["priority"] == 0

    raised = client.patch(f"/jobs/{later_low['id']}", json={"priority": 1})
    assert raised.status_code == 200, raised.text
    assert raised.json()["priority"] == 1 and raised.json()["status"] == "queued"
    assert raised.json()["spec"]["priority"] == 0  # what was asked at submit stays

    order = []
    for _ in range(3):
        job_id, part = run_next(node, part)
        order.append(job_id)
    assert order == [high["id"], later_low["id"], low["id"]]
    assert client.get(f"/jobs/{first['id']}").json()["status"] == "succeeded"


def test_only_a_queued_jobs_priority_changes_within_its_bounds(client: httpx.Client) -> None:
    node = ProtocolNode(client, "the-only-node")
    running = submit(client)
    started(node)
    too_high = client.patch(f"/jobs/{running['id']}", json={"priority": 1001})
    assert too_high.status_code == 422 and "priority" in too_high.json()["detail"][0]["msg"]
    late = client.patch(f"/jobs/{running['id']}", json={"priority": 3})
    assert late.status_code == 409 and "only a queued job's priority" in late.json()["detail"]
    assert client.get(f"/jobs/{running['id']}").json()["priority"] == 0
    unknown = client.patch("/jobs/999999", json={"priority": 3})
    assert unknown.status_code == 404
    not_a_field = client.patch(f"/jobs/{running['id']}", json={"epochs": 3})
    assert not_a_field.status_code == 422
    out_of_bounds = client.post("/jobs", json={"priority": -1001})
    assert out_of_bounds.status_code == 422 and "priority" in out_of_bounds.text


def test_the_cli_submits_with_a_priority_and_changes_it(
    server: ThreadedServer, client: httpx.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    ProtocolNode(client, "busy-node")
    submit(client)  # takes the only slot
    assert cli(["submit", "--server", server.url, "--priority", "-3"]) == 0
    queued = client.get("/jobs", params={"status": "queued"}).json()["data"][0]
    assert queued["priority"] == -3
    capsys.readouterr()
    assert cli(["priority", "--server", server.url, str(queued["id"]), "7"]) == 0
    said = capsys.readouterr().out
    assert f"job {queued['id']}: priority 7 (queued" in said
    assert client.get(f"/jobs/{queued['id']}").json()["priority"] == 7
    assert cli(["priority", "--server", server.url, str(queued["id"]), "5000"]) != 0
    assert "priority" in capsys.readouterr().err
