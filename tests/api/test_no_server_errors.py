"""Whatever a client sends, the answer is never a 5xx: every route of the
app's own OpenAPI document gets hostile paths and bodies."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.api.conftest import ProtocolNode

HOSTILE_IDS = ["0", "-1", "1", "99999", str(2**63), str(2**70), "1.5", "abc", "%00"]
HOSTILE_BODIES: list[Any] = [
    None,
    {},
    [],
    "text",
    {"node_id": 2**70},
    {"node_id": -1, "status": "succeeded"},
    {"node_id": 1, "status": "exploded"},
    {
        "node_id": 1,
        "reports": [
            {
                "seq": 2**64,
                "epoch": 1,
                "batch": 1,
                "batches_per_epoch": 1,
                "at": "2026-01-01T00:00:00Z",
            }
        ],
    },
    {"name": "n" * 1000, "address": "", "slots": 10**9},
    {"topology": {"num_machines": 2**70}},
    {"active_part_ids": [2**70], "wait_s": -1},
    {"lr": "Infinity"},
]


def routes(client: httpx.Client) -> list[tuple[str, str]]:
    spec = client.get("/openapi.json").json()
    return [(method.upper(), path) for path, ops in spec["paths"].items() for method in ops]


def fill(path: str, value: str) -> str:
    for name in ("{job_id}", "{node_id}", "{part_id}", "{study_id}"):
        path = path.replace(name, value)
    return path


def test_every_route_answers_hostile_input_without_a_server_error(client: httpx.Client) -> None:
    ProtocolNode(client, "a")
    client.post("/jobs", json={}).raise_for_status()
    checked = 0
    for method, path in routes(client):
        for value in HOSTILE_IDS if "{" in path else ["-"]:
            url = fill(path, value)
            if method == "GET":
                response = client.get(url, params={"limit": 2**70, "offset": -5})
                assert response.status_code < 500, (method, url, response.text)
                checked += 1
                continue
            for body in HOSTILE_BODIES:
                response = client.request(
                    method,
                    url,
                    content=json.dumps(body),
                    headers={"content-type": "application/json"},
                )
                assert response.status_code < 500, (method, url, body, response.text)
                checked += 1
    assert checked > 100


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_a_diverged_loss_reads_as_null(client: httpx.Client, loss: float) -> None:
    node = ProtocolNode(client, "a")
    job_id = client.post("/jobs", json={}).json()["id"]
    part_id = node.poll()["start"][0]["part_id"]
    report = {
        "seq": 0,
        "epoch": 1,
        "batch": 1,
        "batches_per_epoch": 10,
        "loss": loss,
        "samples_per_sec": 10.0,
        "at": "2026-01-01T00:00:00Z",
    }
    body = json.dumps({"node_id": node.node_id, "reports": [report]})  # NaN/Infinity literals
    response = client.post(
        f"/parts/{part_id}/progress", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    job = client.get(f"/jobs/{job_id}").json()
    assert job["progress"]["batch"] == 1 and job["progress"]["loss"] is None
    assert client.get(f"/jobs/{job_id}/metrics").json()["points"][0]["loss"] is None
