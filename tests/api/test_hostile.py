"""Bytes no well-behaved client sends, at every route that takes a body and
as every caller: numbers beyond a float's range, non-finite literals, lone
surrogates, NUL characters, datetimes at the ends of the calendar. The
answer is a 4xx that says what was wrong, never a 5xx."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.api.conftest import ProtocolNode

# Raw JSON texts: what json.dumps would never write.
NASTY_VALUES = [
    "1e400",  # beyond a float: Python reads infinity
    "-1e400",
    "NaN",
    "Infinity",
    '"\\ud800"',  # a lone surrogate
    '"a\\u0000b"',  # NUL
    '"9999-12-31T23:59:59-23:59"',  # past the end of the calendar once in UTC
    '"0001-01-01T00:00:00+23:59"',  # before its start
    "123456789012345678901234567890",
]
NASTY_KEYS = ['"\\udfff"', '"\\u0000"']


def bodies(template: dict[str, Any]) -> list[str]:
    """The template with each field replaced by each nasty value, in turn,
    at the top level and one level down; and nasty keys added."""
    out = []
    for key, value in template.items():
        for nasty in NASTY_VALUES:
            out.append(json.dumps({**template, key: "@@"}).replace('"@@"', nasty))
            if isinstance(value, dict):
                for inner in value:
                    nested = {**template, key: {**value, inner: "@@"}}
                    out.append(json.dumps(nested).replace('"@@"', nasty))
            if isinstance(value, list) and value and isinstance(value[0], dict):
                for inner in value[0]:
                    nested = {**template, key: [{**value[0], inner: "@@"}]}
                    out.append(json.dumps(nested).replace('"@@"', nasty))
    for nasty_key in NASTY_KEYS:
        out.append(json.dumps({**template, "@@": 1}).replace('"@@"', nasty_key))
    return out


AT = "2026-12-01T00:00:00Z"


def templates(node: int) -> dict[str, dict[str, Any]]:
    return {
        "/jobs": {"name": "x", "topology": {"num_machines": 1, "num_processes": 1}, "lr": 0.5},
        "/studies": {
            "name": "s", "spec": {"epochs": 1}, "rows": [{"num_processes": 1, "batch_size": 8}],
        },
        "/nodes/register": {"name": "b", "address": "127.0.0.1", "slots": 1, "trainers": ["mnist"]},
        "/nodes/{node}/poll": {"active_part_ids": [1], "waiting_for_port": [], "wait_s": 0},
        "/nodes/{node}/heartbeat": {"active_part_ids": [1]},
        "/parts/1/started": {"node_id": node},
        "/parts/1/rendezvous": {"node_id": node, "master_port": 29500},
        "/parts/1/progress": {
            "node_id": node,
            "reports": [{"seq": 1, "epoch": 1, "batch": 1, "batches_per_epoch": 2, "at": AT}],
        },
        "/parts/1/logs": {
            "node_id": node,
            "lines": [{"rank": 0, "offset": 0, "text": "hello", "at": AT}],
        },
        "/parts/1/finish": {"node_id": node, "status": "failed", "reason": "rank_failed"},
    }  # fmt: skip


def test_no_bytes_make_a_server_error(client: httpx.Client) -> None:
    node = ProtocolNode(client, "a")
    client.post("/jobs", json={}).raise_for_status()
    assert node.poll()["start"], "the node has a part to report on"
    failures = []
    sent = 0
    for path, template in templates(node.node_id).items():
        url = path.replace("{node}", str(node.node_id))
        headers = {**node.headers, "content-type": "application/json"}
        for body in bodies(template):
            try:
                answer = client.post(url, content=body.encode(), headers=headers)
            except httpx.TransportError as exc:  # the server dropped the connection
                failures.append(f"{url} {body[:120]} -> {exc!r}")
                continue
            sent += 1
            if answer.status_code >= 500:
                failures.append(f"{url} {body[:120]} -> {answer.status_code}")
            elif answer.status_code == 422:
                detail = answer.json()["detail"]
                assert detail and all(": " in d["msg"] for d in detail), (url, body, detail)
    assert failures == []
    assert sent > 300


@pytest.mark.parametrize("text", ["a\x00b", "\x00"])
def test_a_nul_in_a_string_is_refused_naming_the_field(client: httpx.Client, text: str) -> None:
    answer = client.post("/jobs", json={"name": text})
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["msg"].startswith("name: ")
