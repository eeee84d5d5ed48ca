"""A node's large bodies (over 256 KiB) are decoded in the server's decoder
processes, off its event loop: what the node gets back is what it would
get for the same mistake in a small body, and what it sends is kept."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from api.routes.off_loop import INLINE_BYTES
from tests.api.conftest import ProtocolNode, ThreadedServer, make_settings
from tests.api.test_retention import lines


@pytest.fixture
def roomy(tmp_path: Path) -> Iterator[httpx.Client]:
    settings = make_settings(tmp_path, poll_wait_s=0.0, log_lines_per_second_per_node=100_000)
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def post(client: httpx.Client, node: ProtocolNode, part_id: int, raw: bytes) -> httpx.Response:
    return client.post(
        f"/parts/{part_id}/logs",
        content=raw,
        headers={**node.headers, "content-type": "application/json"},
    )


def batch(node: ProtocolNode, count: int, **change: Any) -> dict[str, Any]:
    sent = lines(0, count)
    sent[-1].update(change)
    return {"node_id": node.node_id, "lines": sent}


def decoders() -> list[psutil.Process]:
    """The decoder processes this (in-process) server has started."""
    found = []
    for child in psutil.Process().children():
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:  # a child of an earlier test, ended (or a zombie)
            continue
    return found


def test_a_large_batch_is_kept_and_its_mistakes_named_as_in_a_small_one(
    roomy: httpx.Client,
) -> None:
    node = ProtocolNode(roomy, "chatty")
    job_id = roomy.post("/jobs", json={}).json()["id"]
    (start,) = node.poll()["start"]
    part_id = start["part_id"]
    small, large = 10, 8000  # about 1 KiB and 600 KiB

    def both(make: Any) -> tuple[httpx.Response, httpx.Response]:
        raws = [make(count) for count in (small, large)]
        assert len(raws[0]) < INLINE_BYTES < len(raws[1])
        first, second = (post(roomy, node, part_id, raw) for raw in raws)
        return first, second

    # A wrong field deep in the batch, an unknown field, a string for a
    # number, a lone surrogate, JSON cut short: the same status, the same words.
    mistakes = {
        "offset": lambda n: json.dumps(batch(node, n, offset=-1)).encode(),
        "extra": lambda n: json.dumps(batch(node, n, colour="red")).encode(),
        "type": lambda n: json.dumps(batch(node, n, rank="0")).encode(),
        "surrogate": lambda n: json.dumps(batch(node, n, text="\ud800")).encode(),
        "cut": lambda n: json.dumps(batch(node, n))[:-2].encode(),
    }
    for name, make in mistakes.items():
        inline, decoded = both(make)
        assert inline.status_code == decoded.status_code == 422, (name, decoded.text)
        # (Numbers aside: the line's index, where the JSON broke.)
        said = [
            [re.sub(r"\d+", "N", e["msg"]) for e in a.json()["detail"]] for a in (inline, decoded)
        ]
        assert said[0] == said[1], (name, said)
    cut = mistakes["cut"](large)
    try:
        json.loads(cut)
    except json.JSONDecodeError as exc:
        where = f"body: not valid JSON at character {exc.pos + 1}: {exc.msg}"
    assert [e["msg"] for e in post(roomy, node, part_id, cut).json()["detail"]] == [where]
    # Nested past the parser's depth: a 400, as inline.
    for size in (1000, INLINE_BYTES):
        nested = b'{"node_id": %d, "lines": ' % node.node_id + b"[" * size + b"]" * size + b"}"
        assert post(roomy, node, part_id, nested).status_code == 400
    assert roomy.get(f"/jobs/{job_id}/logs").json()["lines"] == []

    # The large batch it meant to send is kept, every line of it.
    kept = post(roomy, node, part_id, json.dumps(batch(node, large)).encode())
    assert kept.status_code == 200 and kept.json() == {"accepted": True}, kept.text
    stored = roomy.get(f"/jobs/{job_id}/logs", params={"limit": 10_000}).json()["lines"]
    assert [line["text"] for line in stored] == [f"line {i}" for i in range(large)]
    # ... and it went through a decoder process, not the event loop.
    assert decoders(), "no decoder process was started"


def test_a_body_too_small_to_matter_starts_no_decoder(roomy: httpx.Client) -> None:
    node = ProtocolNode(roomy, "quiet")
    roomy.post("/jobs", json={}).raise_for_status()
    (start,) = node.poll()["start"]
    kept = post(roomy, node, start["part_id"], json.dumps(batch(node, 100)).encode())
    assert kept.status_code == 200, kept.text
    assert decoders() == []
