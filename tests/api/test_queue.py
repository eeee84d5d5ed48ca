"""GET /queue: queued jobs in the order tried, each with its position, what
it needs and why it waits (a code, the numbers, the sentence); a queued job's
own view carries the same."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy.exc import OperationalError

from api.core import jobs, placement
from cli.__main__ import main as cli
from tests.api.conftest import ProtocolNode, ThreadedServer, wait_for
from tests.api.test_jobs_api import submit


def queue(client: httpx.Client) -> dict[str, Any]:
    answer = client.get("/queue")
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def start_all(node: ProtocolNode, running: list[int]) -> list[dict[str, Any]]:
    """The node takes what it is given and reports each started."""
    given: list[dict[str, Any]] = node.poll(running)["start"]
    for assignment in given:
        node.client.post(
            f"/parts/{assignment['part_id']}/started", json={"node_id": node.node_id}
        ).raise_for_status()
    return given


def test_two_nodes_of_two_slots_and_a_big_job_waiting_with_numbers(
    client: httpx.Client,
) -> None:
    a = ProtocolNode(client, "node-a", slots=2)
    b = ProtocolNode(client, "node-b", slots=2)
    small = [submit(client, name=f"small-{i}") for i in range(4)]
    assert [job["status"] for job in small] == ["running"] * 4
    parts = {n.name: start_all(n, []) for n in (a, b)}
    assert sorted(len(given) for given in parts.values()) == [2, 2]  # two per node at once

    big = submit(client, name="big", topology={"num_machines": 2, "num_processes": 2})
    later_small = submit(client, name="later-small")
    urgent = submit(client, name="urgent", priority=5)
    state = queue(client)
    assert [q["job_id"] for q in state["data"]] == [urgent["id"], big["id"], later_small["id"]]
    assert [q["position"] for q in state["data"]] == [1, 2, 3]
    assert state["nodes_live"] == 2 and state["slots_free"] == 0
    first, waiting_big, behind = state["data"]
    assert first["pending"]["code"] == "waiting_for_slots"
    assert waiting_big["needs"] == {
        "nodes": 2,
        "slots_per_node": 1,
        "gpus_per_node": 0,
        "trainer": "mnist",
        "script": None,
    }
    assert behind["pending"]["code"] == "queued_behind"
    assert behind["pending"]["behind_job"] == urgent["id"]
    numbers = {k: first["pending"][k] for k in ("nodes_needed", "nodes_suitable", "nodes_free")}
    assert numbers == {"nodes_needed": 1, "nodes_suitable": 2, "nodes_free": 0}

    # The job's own view says the same while it is queued.
    view = client.get(f"/jobs/{big['id']}").json()
    assert view["queue_position"] == 2 and view["pending"] == waiting_big["pending"]

    # Raising the later small job moves it up at once.
    raised = client.patch(f"/jobs/{later_small['id']}", json={"priority": 9})
    assert raised.status_code == 200 and raised.json()["queue_position"] == 1
    assert queue(client)["data"][0]["job_id"] == later_small["id"]

    # One slot frees on node a: the first in line takes it, nothing overtakes.
    a_parts = parts["node-a"]
    a.finish(a_parts[0]["part_id"], "succeeded", exit_code=0).raise_for_status()
    taken = start_all(a, [a_parts[1]["part_id"]])
    assert [p["job_id"] for p in taken] == [later_small["id"]]
    state = queue(client)
    assert [q["job_id"] for q in state["data"]] == [urgent["id"], big["id"]]

    # Slots free on both nodes: the urgent job, then the big one across both.
    b_parts = parts["node-b"]
    for node, part in ((a, a_parts[1]), (a, taken[0]), (b, b_parts[0]), (b, b_parts[1])):
        node.finish(part["part_id"], "succeeded", exit_code=0).raise_for_status()
    assert client.get(f"/jobs/{urgent['id']}").json()["status"] == "running"
    assert client.get(f"/jobs/{big['id']}").json()["status"] == "running"
    assert queue(client)["data"] == []
    assert client.get(f"/jobs/{big['id']}").json()["queue_position"] is None


def test_a_job_no_node_can_run_says_so_with_the_numbers(client: httpx.Client) -> None:
    ProtocolNode(client, "cpu-only")
    job = submit(client, trainer="resnet")
    pending = client.get(f"/jobs/{job['id']}").json()["pending"]
    assert pending["code"] == "no_suitable_nodes"
    assert (pending["nodes_needed"], pending["nodes_suitable"], pending["nodes_live"]) == (1, 0, 1)
    assert "resnet" in pending["reason"]
    assert queue(client)["data"][0]["needs"]["trainer"] == "resnet"


def test_the_cli_shows_the_queue_in_order_with_its_reasons(
    server: ThreadedServer, client: httpx.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    ProtocolNode(client, "busy-node")
    submit(client)  # takes the only slot
    low = submit(client, name="low")
    high = submit(client, name="high", priority=2)
    capsys.readouterr()
    assert cli(["queue", "--server", server.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[1:-1]]
    assert [(row[0], row[1], row[2]) for row in rows] == [
        ("1", str(high["id"]), "2"),
        ("2", str(low["id"]), "0"),
    ]
    assert "waiting_for_slots" in lines[1] and f"queued behind job {high['id']}" in lines[2]
    assert lines[-1] == "(2 queued; 1 live node(s), 0 free slot(s))"


def test_submits_at_the_same_time_are_each_answered_with_their_placement(
    client: httpx.Client, server: ThreadedServer
) -> None:
    """Submits arriving together are written and planned together
    (Core.writes), yet each answer says where its job started, as a submit
    alone does."""
    nodes = [ProtocolNode(client, f"n{i}") for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        jobs = list(pool.map(lambda i: submit(client, name=f"burst-{i}"), range(12)))
    assert all(job["status"] == "running" for job in jobs), [j["status"] for j in jobs]
    placed = sorted(a["part_id"] for node in nodes for a in node.poll()["start"])
    assert len(placed) == 12  # one a node: the plan spread them


@pytest.mark.parametrize(
    "failing",
    [
        # The plan: it starts the job, then raises.
        (placement, "schedule"),
        # The check of whether the queue needs one, before any plan.
        (jobs, "needs_a_plan"),
    ],
    ids=["the plan", "the check whether to plan"],
)
def test_a_plan_that_fails_leaves_the_submitted_job_queued_and_the_clock_places_it(
    client: httpx.Client,
    server: ThreadedServer,
    monkeypatch: pytest.MonkeyPatch,
    failing: tuple[object, str],
) -> None:
    ProtocolNode(client, "n1")
    module, name = failing
    real = getattr(module, name)
    failures: list[bool] = []

    def fails_once(*args: Any) -> bool:
        if not failures:
            failures.append(True)
            if name == "schedule":
                assert real(*args)  # it started the job
            raise OperationalError("SELECT", {}, Exception("the database went away"))
        return bool(real(*args))

    monkeypatch.setattr(module, name, fails_once)
    job = submit(client, name="kept")
    # The submit stands, answered; nothing of the failed plan does.
    assert failures and job["status"] == "queued"
    assert client.get(f"/jobs/{job['id']}").json()["attempts"] == []
    wait_for(
        lambda: client.get(f"/jobs/{job['id']}").json()["status"] == "running",
        what="the clock's next tick to place the job",
    )
    assert [a["number"] for a in client.get(f"/jobs/{job['id']}").json()["attempts"]] == [1]
