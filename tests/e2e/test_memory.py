"""A reader that varies its query string cannot make the server hold what
it likes: the read cache is bounded in bytes, lets go of answers past their
second, and only parameters a route declares make a new entry."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from cli.cluster import LocalCluster
from tests.api.conftest import ProtocolNode, wait_for

LINES = 800
LINE = "x" * 3990  # about as long as a line may be: ~250 of them make a page's MiB
READS = 500
MB = 2**20


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(state_dir=tmp_path / "cluster", data_dir=tmp_path, workers=0) as c:
        yield c


def test_distinct_reads_of_a_large_answer_leave_the_servers_memory_bounded(
    cluster: LocalCluster,
) -> None:
    assert cluster.tokens is not None and cluster.server is not None
    with httpx.Client(base_url=cluster.url, timeout=30, headers=cluster.headers("read")) as reader:
        job_id = logged_job(cluster, reader)
        logs = f"/jobs/{job_id}/logs"
        assert len(reader.get(logs, params={"limit": 10_000}).content) < 1.1 * MB  # a page's cap
        unknown = reader.get(logs, params={"v": "1"})
        assert unknown.status_code == 422 and unknown.json()["detail"][0]["msg"].startswith("v:")

        server = psutil.Process(cluster.server.process.pid)
        for since in range(3):  # the first reads' one-off costs (imports, buffers)
            reader.get(logs, params={"since": since}).raise_for_status()
        time.sleep(1.5)  # past the cache's second: what is left is the baseline
        before = server.memory_info().rss
        peak = before
        for since in range(READS):  # each a different page of about 1 MiB
            page = reader.get(logs, params={"since": since, "limit": 10_000})
            assert len(page.json()["lines"]) > 200
            peak = max(peak, server.memory_info().rss)
        grew_mb = (peak - before) / MB
        assert grew_mb < 50, f"{READS} distinct reads grew the server by {grew_mb:.0f} MB"
        # Silence: the cache drops its answers once their second has passed.
        wait_for(
            lambda: server.memory_info().rss - before < 10 * MB,
            timeout_s=10,
            what="the server's memory to fall back",
        )


def logged_job(cluster: LocalCluster, reader: httpx.Client) -> int:
    """A running job whose one node has sent LINES long log lines."""
    assert cluster.tokens is not None
    with httpx.Client(base_url=cluster.url, timeout=30) as client:
        job_id: int = (
            client.post("/jobs", json={}, headers=cluster.headers("user"))
            .raise_for_status()
            .json()["id"]
        )
        node = ProtocolNode(client, "writer", join_token=cluster.tokens.join)
        part_id = wait_for(lambda: node.poll()["start"], what="an assignment")[0]["part_id"]
        started = {"node_id": node.node_id}
        client.post(f"/parts/{part_id}/started", json=started, headers=node.headers)
        for first in range(0, LINES, 200):
            lines = [
                {"rank": 0, "offset": i * 4000, "text": LINE, "at": "2026-12-01T00:00:00Z"}
                for i in range(first, first + 200)
            ]
            client.post(
                f"/parts/{part_id}/logs",
                json={"node_id": node.node_id, "lines": lines},
                headers=node.headers,
            ).raise_for_status()
    assert len(reader.get(f"/jobs/{job_id}/logs", params={"tail": 10}).json()["lines"]) == 10
    return job_id
