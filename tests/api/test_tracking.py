"""TensorBoard event files (DDPO_TENSORBOARD_DIR): rank 0's reports, as the
server records them, read back with tensorboard's own reader to the values
GET /jobs/{id}/metrics gives; resent reports are written once; a server
without the setting writes nothing."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cli.cluster import free_port
from tests.api.conftest import ProtocolNode, ThreadedServer, make_settings
from tests.api.test_protocol import submit
from tests.api.test_retries import started

START = datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc)


def report(seq: int, **fields: Any) -> dict[str, Any]:
    batch = seq % 4 + 1
    return {
        "seq": seq,
        "epoch": seq // 4 + 1,
        "batch": batch,
        "batches_per_epoch": 4,
        "loss": 2.0 / (seq + 1),
        "samples_per_sec": 1000.0 + seq,
        "at": (START + timedelta(seconds=seq)).isoformat(),
        **fields,
    }


def send(node: ProtocolNode, part_id: int, reports: list[dict[str, Any]]) -> None:
    node.client.post(
        f"/parts/{part_id}/progress", json={"node_id": node.node_id, "reports": reports}
    ).raise_for_status()


def scalars(folder: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar in the folder's event files: tag -> (step, value, wall time)."""
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value, e.wall_time) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def test_a_jobs_reports_read_back_from_its_event_files_as_the_api_gives_them(
    tmp_path: Path,
) -> None:
    logdir = tmp_path / "tensorboard"
    settings = make_settings(tmp_path, poll_wait_s=0.5, tensorboard_dir=logdir)
    server = ThreadedServer(settings)
    with server, httpx.Client(base_url=server.url, timeout=10) as c:
        node = ProtocolNode(c, "a")
        job_id = submit(c, epochs=3)
        part_id = started(node)["part_id"]
        sent = [report(seq) for seq in range(6)]
        sent[2]["metrics"] = {"accuracy": 0.5, "lr/group-0": 0.1}
        sent[5]["metrics"] = {"accuracy": 0.75, "grad_norm": None}
        sent[4]["step"] = 40  # the trainer's own count, where it gives one
        send(node, part_id, sent[:3])
        send(node, part_id, sent[1:])  # resent reports: written once
        metrics = c.get(f"/jobs/{job_id}/metrics").raise_for_status().json()
        server.app_core().tracking.flush()
    got = scalars(logdir / f"job-{job_id}")
    expected: dict[str, list[tuple[int, float, float]]] = {}
    for point in metrics["points"]:
        at = datetime.fromisoformat(point["at"].replace("Z", "+00:00")).timestamp()
        values = {"loss": point["loss"], "samples_per_sec": point["samples_per_sec"]}
        for name, value in {**values, **point["metrics"]}.items():
            if value is not None:
                expected.setdefault(name, []).append((point["step"], value, at))
    assert set(got) == set(expected) == {"loss", "samples_per_sec", "accuracy", "lr/group-0"}
    for tag, points in expected.items():
        # TensorBoard keeps scalars as 32-bit floats.
        assert [(s, pytest.approx(v, rel=1e-6), t) for s, v, t in points] == got[tag], tag
    assert [s for s, _, _ in got["loss"]] == [1, 2, 3, 4, 40, 6]


def test_without_the_setting_no_event_file_is_written(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, poll_wait_s=0.5)
    server = ThreadedServer(settings)
    with server, httpx.Client(base_url=server.url, timeout=10) as c:
        node = ProtocolNode(c, "a")
        submit(c)
        send(node, started(node)["part_id"], [report(0)])
        assert server.app_core().tracking.sinks == []
    assert not list(tmp_path.rglob("events.out.tfevents.*"))


def test_with_mlflow_away_a_part_starts_untracked_and_its_reports_are_heard(
    tmp_path: Path,
) -> None:
    """MLflow down (nothing listens at its URL): a node asking for its job's
    run is answered without one, at once the second time, and the job's
    reports are recorded as ever; never a 5xx, never a wait on MLflow."""
    nobody = f"http://127.0.0.1:{free_port()}"
    # The hand-played node sends no heartbeats: on a busy CI host it must
    # not be lost while MLflow's client gives up (CI's PostgreSQL lane lost it).
    settings = make_settings(
        tmp_path, poll_wait_s=0.5, mlflow_tracking_uri=nobody, heartbeat_timeout_s=300
    )
    server = ThreadedServer(settings)
    with server, httpx.Client(base_url=server.url, timeout=30) as c:
        node = ProtocolNode(c, "a")
        job_id = submit(c)
        assignment = started(node)
        assert assignment["tracking"] == {"tracking_uri": nobody, "run_id": None}
        for _ in range(2):
            answer = c.post(
                f"/parts/{assignment['part_id']}/tracking-run", json={"node_id": node.node_id}
            )
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"tracking_uri": nobody, "run_id": None}
        assert server.app_core().tracking.mlflow is not None
        assert not server.app_core().tracking.mlflow.available()
        send(node, assignment["part_id"], [report(0), report(1)])
        server.app_core().tracking.flush()
        points = c.get(f"/jobs/{job_id}/metrics").raise_for_status().json()["points"]
        assert [p["step"] for p in points] == [1, 2]
