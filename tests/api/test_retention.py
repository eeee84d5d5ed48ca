"""What the server stops keeping (log lines, progress rows, final models,
idempotency keys) and how much it lets checkpoints take (one upload per
part at a time, a disk quota), driven over HTTP by a hand-played node."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import ProtocolNode, ThreadedServer, make_settings, wait_for
from tests.api.test_protocol import job, submit
from tests.api.test_retries import progress, put_checkpoint, started, upload_checkpoint

SECOND_IN_DAYS = 1 / 86400


def lines(first: int, count: int) -> list[dict[str, Any]]:
    return [
        {"rank": 0, "offset": 100 * i, "text": f"line {i}", "at": "2026-12-01T00:00:00Z"}
        for i in range(first, first + count)
    ]


@pytest.fixture
def forgetful(tmp_path: Path) -> Iterator[httpx.Client]:
    """A server that keeps things for about a second, pruning five times a second."""
    settings = make_settings(
        tmp_path,
        poll_wait_s=0.5,
        sweep_interval_s=0.1,
        retention_interval_s=0.2,
        log_retention_days=2 * SECOND_IN_DAYS,
        checkpoint_retention_days=2 * SECOND_IN_DAYS,
        idempotency_key_hours=2 / 3600,
        max_log_lines_per_job=5,
        artifacts_dir=tmp_path / "artifacts",
    )
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def test_a_job_keeps_only_its_newest_log_lines(forgetful: httpx.Client) -> None:
    node = ProtocolNode(forgetful, "a")
    job_id = submit(forgetful)
    part_id = started(node)["part_id"]
    forgetful.post(
        f"/parts/{part_id}/logs", json={"node_id": node.node_id, "lines": lines(0, 20)}
    ).raise_for_status()
    kept = wait_for(
        lambda: len(t := texts(forgetful, job_id)) == 5 and t, what="the oldest lines pruned"
    )
    assert kept == [f"line {i}" for i in range(15, 20)]


def texts(client: httpx.Client, job_id: int) -> list[str]:
    return [line["text"] for line in client.get(f"/jobs/{job_id}/logs").json()["lines"]]


def test_an_ended_job_loses_its_logs_progress_and_final_model_but_not_its_record(
    forgetful: httpx.Client,
) -> None:
    node = ProtocolNode(forgetful, "a")
    job_id = submit(forgetful)
    part_id = started(node)["part_id"]
    assert progress(node, part_id, seq=1, epoch=1)
    forgetful.post(
        f"/parts/{part_id}/logs", json={"node_id": node.node_id, "lines": lines(0, 3)}
    ).raise_for_status()
    assert upload_checkpoint(node, part_id, 1, b"the final model")
    node.finish(part_id, "succeeded", exit_code=0).raise_for_status()
    assert forgetful.get(f"/jobs/{job_id}/model").content == b"the final model"

    gone = wait_for(
        lambda: (m := forgetful.get(f"/jobs/{job_id}/model")).status_code == 404 and m,
        what="the final model removed",
    )
    assert "removed" in gone.json()["detail"] and "epoch 1" in gone.json()["detail"]
    wait_for(lambda: texts(forgetful, job_id) == [], what="the logs removed")
    wait_for(
        lambda: forgetful.get(f"/jobs/{job_id}/metrics").json()["points"] == [],
        what="the progress rows removed",
    )
    view = job(forgetful, job_id)
    assert view["status"] == "succeeded" and view["attempts"][0]["number"] == 1


def test_an_idempotency_key_makes_a_new_job_once_it_has_expired(forgetful: httpx.Client) -> None:
    key = {"Idempotency-Key": "nightly-run"}
    first = forgetful.post("/jobs", json={}, headers=key).raise_for_status()
    assert forgetful.post("/jobs", json={}, headers=key).status_code == 200  # the same job
    again = wait_for(
        lambda: (r := forgetful.post("/jobs", json={}, headers=key)).status_code == 201 and r,
        what="the key to expire",
    )
    assert again.json()["id"] != first.json()["id"]


@pytest.fixture
def small_quota(tmp_path: Path) -> Iterator[tuple[ThreadedServer, ProtocolNode, int]]:
    """A server with a 1 MiB quota, and a node running machine 0 of a job."""
    settings = make_settings(
        tmp_path, poll_wait_s=0.5, artifacts_quota_mb=1, artifacts_dir=tmp_path / "artifacts"
    )
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        node = ProtocolNode(c, "a")
        submit(c, epochs=3)
        yield server, node, started(node)["part_id"]


def test_checkpoints_past_the_quota_are_refused_naming_it(
    small_quota: tuple[ThreadedServer, ProtocolNode, int],
) -> None:
    _, node, part_id = small_quota
    too_big = put_checkpoint(node, part_id, 1, b"x" * (2 * 2**20))
    assert too_big.status_code == 413
    assert "DDPO_ARTIFACTS_QUOTA_MB=1" in too_big.json()["detail"]
    assert upload_checkpoint(node, part_id, 1, b"x" * (2**19))  # half of it fits


def test_a_part_uploads_one_checkpoint_at_a_time(
    small_quota: tuple[ThreadedServer, ProtocolNode, int],
) -> None:
    server, node, part_id = small_quota

    def first_upload() -> socket.socket:
        """Its head and part of its body, the rest held back."""
        sock = socket.create_connection(("127.0.0.1", server.settings.port))
        sock.sendall(
            f"PUT /parts/{part_id}/checkpoint?node_id={node.node_id}&epoch=1 HTTP/1.1\r\n"
            f"Host: 127.0.0.1\r\nAuthorization: Bearer {node.credential}\r\n"
            "Content-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\n".encode()
            + b"x" * 100
        )
        return sock

    def refused_beside_a_slow_one() -> httpx.Response | None:
        with first_upload():
            # The second may overtake the first (then the first is the one refused):
            # try again until it comes second.
            second = put_checkpoint(node, part_id, 1, b"y" * 10)
            return second if second.status_code == 409 else None

    second = wait_for(refused_beside_a_slow_one, what="an upload refused beside another")
    assert "uploading a checkpoint already" in second.json()["detail"]
    # Once the first is gone (its connection closed), the part may upload again.
    # (The server learns the first is gone when its read of the body fails:
    # until then, a new upload is still refused with 409.)
    wait_for(
        lambda: (
            (r := put_checkpoint(node, part_id, 1, b"z" * 10)).status_code == 200
            and r.json()["accepted"]
        ),
        what="a new upload taken",
    )


def test_a_checkpoint_removed_as_it_is_asked_for_is_a_404_not_a_broken_answer(
    small_quota: tuple[ThreadedServer, ProtocolNode, int],
) -> None:
    """Retention (or a newer checkpoint) may delete the file between the
    server reading the job's row and opening it: the answer says it is gone."""
    server, node, part_id = small_quota
    assert upload_checkpoint(node, part_id, 1, b"epoch one")
    job_id = node.client.get("/jobs").json()["data"][0]["id"]
    served = node.client.get(f"/jobs/{job_id}/model")
    assert served.status_code == 200 and served.content == b"epoch one"
    assert served.headers["content-length"] == "9"
    assert f"job-{job_id}-epoch-1.pt" in served.headers["content-disposition"]
    (stored,) = (server.settings.artifacts_dir / f"job-{job_id}").iterdir()
    stored.unlink()  # gone from disk, still named by the job's row
    gone = node.client.get(f"/jobs/{job_id}/model")
    assert gone.status_code == 404 and "was just removed" in gone.json()["detail"]


def test_concurrent_uploads_never_pass_the_quota_together(tmp_path: Path) -> None:
    """Three machine-0 nodes upload 600 KiB each at once under a 1 MiB quota:
    the bytes are charged as they arrive, so at most one is kept, where each
    used to be measured against the room left when it started."""
    settings = make_settings(
        tmp_path, poll_wait_s=0.5, artifacts_quota_mb=1, artifacts_dir=tmp_path / "artifacts"
    )
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        nodes = [ProtocolNode(c, name) for name in ("a", "b", "c")]
        for _ in nodes:
            submit(c, epochs=3)
        uploads = []
        for node in nodes:
            (start,) = node.poll()["start"]
            sock = socket.create_connection(("127.0.0.1", settings.port))
            sock.sendall(
                f"PUT /parts/{start['part_id']}/checkpoint?node_id={node.node_id}&epoch=1 "
                f"HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {node.credential}\r\n"
                "Content-Type: application/octet-stream\r\n"
                f"Content-Length: {600 * 1024}\r\n\r\n".encode()
                + b"x" * (300 * 1024)
            )
            uploads.append(sock)
        # All three are under way, 900 KiB arrived; now the rest of each.
        answers = []
        for sock in uploads:
            with sock:
                with contextlib.suppress(OSError):  # refused and closed mid-body
                    sock.sendall(b"x" * (300 * 1024))
                sock.settimeout(10)
                answers.append(sock.recv(4096).split(b"\r\n", 1)[0])
        kept = sum(
            f.stat().st_size for f in (tmp_path / "artifacts").glob("job-*/*.pt") if f.is_file()
        )
        assert kept <= 2**20, (kept, answers)
        assert answers.count(b"HTTP/1.1 200 OK") == 1, answers
        assert answers.count(b"HTTP/1.1 413 Request Entity Too Large") == 2, answers


def test_partial_uploads_are_removed_when_the_server_starts_again(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, artifacts_dir=tmp_path / "artifacts")
    incoming = tmp_path / "artifacts" / ".incoming"
    mine = incoming / f"{socket.gethostname()}-{settings.port}"
    another = incoming / "another-host-8000"
    for folder in (mine, another):
        folder.mkdir(parents=True)
    (mine / "cut-off").write_bytes(b"x" * 1000)  # as a kill -9 mid-upload leaves it
    (incoming / "from-an-older-version").write_bytes(b"x" * 1000)
    (another / "arriving-there-now").write_bytes(b"x" * 1000)
    with ThreadedServer(settings):
        assert sorted(p.name for p in incoming.glob("**/*") if p.is_file()) == [
            "arriving-there-now"  # another server's, being received: left alone
        ]
