"""Several machines for real: the server and each worker on a test host of
its own (a network namespace with its own address, cli/hosts.py), the
host name resolving to loopback on every one of them, as on most Debian
and Ubuntu machines. Jobs train across the bridge; links are slowed and
cut. CI sets DDPO_REQUIRE_TEST_HOSTS: there these tests never skip."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli import hosts as test_hosts
from cli.cluster import LocalCluster
from cli.hosts import TestHosts
from tests.conftest import REPO
from tests.e2e.conftest import EXAMPLES, Jobs, record, still_running, training_processes, until
from worker import cores

pytestmark = pytest.mark.e2e

HEARTBEAT_TIMEOUT_S = 6.0
RESIZE_INTERVAL_S = 5.0


def require_test_hosts() -> None:
    reason = test_hosts.unavailable_reason()
    if reason is None:
        return
    if os.environ.get("DDPO_REQUIRE_TEST_HOSTS"):
        pytest.fail(f"DDPO_REQUIRE_TEST_HOSTS is set but test hosts cannot be made: {reason}")
    pytest.skip(f"test hosts unavailable: {reason}")


@contextlib.contextmanager
def hosted_cluster(
    state_dir: Path, data_dir: Path, workers: int, **options: object
) -> Iterator[tuple[TestHosts, LocalCluster]]:
    """The server on host "server", worker node-i on host "node-i"."""
    require_test_hosts()
    names = ["server", *(f"node-{i}" for i in range(workers))]
    with (
        TestHosts(names) as hosts,
        LocalCluster(
            state_dir=state_dir,
            data_dir=data_dir,
            workers=workers,
            hosts=hosts,
            **options,  # type: ignore[arg-type]
        ) as cluster,
    ):
        yield hosts, cluster


@pytest.fixture(scope="module")
def three(
    mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory, script_dir: Path
) -> Iterator[tuple[TestHosts, LocalCluster]]:
    """Three worker hosts: a 2-machine job, and a third host to move to."""
    assert "GLOO_SOCKET_IFNAME" not in os.environ, "the tests must not pick the interface"
    with hosted_cluster(
        tmp_path_factory.mktemp("multihost"),
        mnist_dir,
        workers=3,
        worker_args=["--script-dir", str(script_dir)],
        server_env={
            "DDPO_RETRY_BACKOFF_S": "0.5",
            "DDPO_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S),
            "DDPO_RESIZE_INTERVAL_S": str(RESIZE_INTERVAL_S),
        },
    ) as running:
        yield running


@pytest.fixture
def jobs(three: tuple[TestHosts, LocalCluster]) -> Iterator[Jobs]:
    hosts, cluster = three
    with cluster.client() as client:
        yield Jobs(client)
        for name in hosts.names:
            hosts.link_up(name)
            hosts.clear_rate(name)
        for job in client.get("/jobs", params={"limit": 500}).json()["data"]:
            if job["status"] in ("queued", "running"):
                client.post(f"/jobs/{job['id']}/cancel")
        until(
            lambda: not any(n["parts"] for n in client.get("/nodes").json()["data"]),
            60,
            "idle nodes",
        )


def gradient_bytes() -> int:
    from worker.mnist import Net

    return sum(p.numel() * p.element_size() for p in Net().parameters())


def node_of(job: dict[str, Any], machine_id: int) -> dict[str, Any]:
    part: dict[str, Any] = next(p for p in job["parts"] if p["machine_id"] == machine_id)
    return part


def test_a_2x1_job_trains_across_hosts_over_the_bridge(
    jobs: Jobs, three: tuple[TestHosts, LocalCluster]
) -> None:
    hosts, _cluster = three
    steps = 30
    before = {name: hosts.bytes_moved(name) for name in hosts.names}
    job_id = jobs.submit(machines=2, processes=1, batch_size=64, max_steps_per_epoch=steps)
    job = jobs.wait_done(job_id)
    sent = assert_trained_across_hosts(hosts, job, before, steps)
    record(
        "2 x 1 across two test hosts",
        steps=steps,
        gradient_bytes_per_step=gradient_bytes(),
        sent_by_machine_1=sent[1],
    )


def assert_trained_across_hosts(
    hosts: TestHosts, job: dict[str, Any], before: dict[str, tuple[int, int]], steps: int
) -> list[int]:
    """The job succeeded between two hosts, over the bridge. The bytes each
    machine sent."""
    assert job["status"] == "succeeded", job["error"]
    machines = [node_of(job, 0), node_of(job, 1)]
    # The rendezvous is at machine 0's host address, and every node
    # advertises its own host's address: nothing here says 127.0.0.1.
    assert job["master_addr"] == hosts.address(machines[0]["node_name"])
    for part in machines:
        assert part["node_address"] == hosts.address(part["node_name"])
    # The gradients crossed the bridge: each step all-reduces them between
    # the two hosts, so each host sent and received at least their size.
    least = steps * gradient_bytes()
    sent_by = []
    for part in machines:
        name = part["node_name"]
        received = hosts.bytes_moved(name)[0] - before[name][0]
        sent = hosts.bytes_moved(name)[1] - before[name][1]
        assert sent >= least and received >= least, (name, sent, received, least)
        sent_by.append(sent)
    return sent_by


def test_a_torchrun_script_runs_on_one_host_across_two_and_under_torchrun_unchanged(
    jobs: Jobs, three: tuple[TestHosts, LocalCluster], tmp_path: Path
) -> None:
    """examples/scripts/torchrun_mlp.py as a 1 x 2 job, as a 2 x 1 job across
    two test hosts, and under plain torchrun: the same bytes each time."""
    hosts, _cluster = three
    example = EXAMPLES / "scripts" / "torchrun_mlp.py"
    args = ["--epochs", "2", "--steps-per-epoch", "20"]
    (offered,) = [
        s for s in jobs.client.get("/trainers").json()["scripts"] if s["path"] == example.name
    ]
    assert offered["sha256"] == hashlib.sha256(example.read_bytes()).hexdigest()
    assert sorted(offered["nodes"]) == ["node-0", "node-1", "node-2"]

    one_host = jobs.wait_done(jobs.submit(processes=2, script={"path": example.name, "args": args}))
    assert one_host["status"] == "succeeded", one_host["error"]
    assert len({p["node_name"] for p in one_host["parts"]}) == 1

    before = {name: hosts.bytes_moved(name) for name in hosts.names}
    job_id = jobs.submit(machines=2, script={"path": example.name, "args": args})
    job = jobs.wait_done(job_id)
    assert job["status"] == "succeeded", job["error"]
    machines = [node_of(job, 0), node_of(job, 1)]
    assert machines[0]["node_name"] != machines[1]["node_name"]
    assert job["master_addr"] == hosts.address(machines[0]["node_name"])
    # Its gradients (an MLP's: 16x64 + 64 + 64x4 + 4 floats) crossed the
    # bridge at each of its 40 steps.
    least = 40 * (16 * 64 + 64 + 64 * 4 + 4) * 4
    for part in machines:
        name = part["node_name"]
        assert hosts.bytes_moved(name)[1] - before[name][1] >= least, name
    for done in (one_host, job):
        progress = done["progress"]
        assert (progress["epoch"], progress["batch"], progress["step"]) == (2, 20, 40)
        assert 0 <= progress["metrics"]["accuracy"] <= 1
    logs = jobs.client.get(f"/jobs/{job_id}/logs").json()["lines"]
    assert (1, "rank 1 of 2 (local 0, machine 1): epochs 1..2") in {
        (line["rank"], line["text"]) for line in logs
    }

    torchrun = Path(sys.executable).parent / "torchrun"
    plain = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node", "2", str(example), *args],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("DDPO_")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    # Outside ddpo, report() prints on rank 0.
    printed = [line for line in plain.stdout.splitlines() if line.startswith("[ddpo] step ")]
    assert [line.split(":")[0] for line in printed] == [
        f"[ddpo] step {s}" for s in (10, 20, 30, 40)
    ]


def rows_of_attempt(cluster: LocalCluster, job_id: int, number: int) -> tuple[int, int]:
    """(progress rows, log rows) stored for one attempt of a job."""
    with sqlite3.connect(cluster.database_path) as db:
        (attempt_id,) = db.execute(
            "SELECT id FROM attempt WHERE job_id = ? AND number = ?", (job_id, number)
        ).fetchone()
        counts = [
            db.execute(f"SELECT COUNT(*) FROM {table} WHERE attempt_id = ?", (attempt_id,))
            for table in ("progress", "log_line")
        ]
        return counts[0].fetchone()[0], counts[1].fetchone()[0]


def test_a_cut_link_moves_the_job_to_another_host_and_fences_the_stale_ranks(
    jobs: Jobs, three: tuple[TestHosts, LocalCluster]
) -> None:
    hosts, cluster = three
    job_id = jobs.submit(
        machines=2, processes=1, batch_size=64, epochs=2, max_steps_per_epoch=300, max_restarts=1
    )
    job = jobs.wait(
        job_id,
        lambda j: (
            j["checkpoint"] is not None
            and j["progress"] is not None
            and j["progress"]["epoch"] == 2
        ),
        180,
        "epoch 2, after the checkpoint of epoch 1",
    )
    assert job["status"] == "running"
    survivor, victim = node_of(job, 0)["node_name"], node_of(job, 1)["node_name"]
    (third,) = set(hosts.names) - {"server", survivor, victim}
    stale = training_processes(cluster)[victim]
    assert stale, f"nothing runs on {victim}"

    hosts.link_down(victim)
    cut_at = time.monotonic()
    with cluster.client() as client:

        def state_of(name: str) -> str:
            nodes = client.get("/nodes").json()["data"]
            state: str = next(n["state"] for n in nodes if n["name"] == name)
            return state

        left = jobs.wait(job_id, lambda j: j["status"] != "running", 10, "the job to leave running")
        left_running_s = time.monotonic() - cut_at
        until(lambda: state_of(victim) == "lost", HEARTBEAT_TIMEOUT_S + 2, f"{victim} lost")
        lost_s = time.monotonic() - cut_at
        moved = jobs.wait(
            job_id,
            lambda j: j["attempt"] == 2 and j["status"] == "running",
            60,
            "the retry to start",
        )
        assert {p["node_name"] for p in moved["parts"]} == {survivor, third}
        assert moved["attempts"][0]["error"]["reason"] == "node_lost", moved["attempts"]
        assert moved["attempts"][1]["resumed_from_epoch"] == 1
        rows_at_heal = rows_of_attempt(cluster, job_id, number=1)

        hosts.link_up(victim)
        healed_at = time.monotonic()
        until(lambda: still_running(stale) == [], 5, "the stale ranks to be stopped")
        stale_gone_s = time.monotonic() - healed_at
        # The healed node's daemon has settled what it held: its reports
        # were refused and it let go of the part.
        victim_log = cluster.state_dir / f"{victim}.log"
        old_part = re.compile(rf"part \d+ \(job {job_id} machine 1\) (cancelled|failed)")
        until(
            lambda: old_part.search(victim_log.read_text()),
            60,
            f"{victim}'s daemon to let go of the old part",
        )
        until(lambda: state_of(victim) == "live", 30, f"{victim} live again")
        rows_after = rows_of_attempt(cluster, job_id, number=1)
        assert rows_after == rows_at_heal, "the cut-off node's reports landed"

    done = jobs.wait_done(job_id, timeout_s=240)
    assert done["status"] == "succeeded", done["error"]
    assert left["status"] == "queued"
    record(
        "cut machine 1's link mid-epoch (2 x 1, three worker hosts, max_restarts=1)",
        left_running_s=round(left_running_s, 2),
        node_lost_s=round(lost_s, 2),
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        stale_ranks_gone_after_heal_s=round(stale_gone_s, 2),
        old_attempt_rows_added_after_heal=sum(rows_after) - sum(rows_at_heal),
    )


def test_an_elastic_job_shrinks_past_a_cut_link_and_grows_back_when_the_host_returns(
    jobs: Jobs, three: tuple[TestHosts, LocalCluster]
) -> None:
    """Issue 28's elastic job, 1 to 3 machines on three worker hosts: one
    host's link is cut mid-epoch and the job carries on with two from its
    latest step checkpoint; the host comes back and the job grows to three
    again; it ends with the recipe's accuracy, and never used a restart."""
    hosts, _cluster = three
    # 400 Mbit/s links: an all-reduce of 4.7 MB of gradients takes a tenth
    # of a second, so the epoch lasts long enough to be resized twice.
    for name in hosts.names:
        if name != "server":
            hosts.limit_rate(name, 400)
    every = 20
    response = jobs.client.post(
        "/jobs",
        json={
            "topology": {"num_machines": {"min": 1, "max": 3}, "num_processes": 1},
            "batch_size": 64,
            "checkpoint_every_steps": every,
            "max_restarts": 0,
        },
    )
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    job = jobs.wait(
        job_id,
        lambda j: j["attempt"] == 1 and (j["checkpoint"] or {}).get("step") is not None,
        120,
        "attempt 1 on three machines, with a step checkpoint",
    )
    assert len(job["parts"]) == 3 and job["world_size"] == 3
    victim = node_of(job, 1)["node_name"]

    hosts.link_down(victim)
    cut_at = time.monotonic()
    shrunk = jobs.wait(
        job_id,
        lambda j: j["attempt"] == 2 and j["status"] == "running" and j["progress"] is not None,
        60,
        "attempt 2 to train on the two hosts left",
    )
    shrink_s = time.monotonic() - cut_at
    assert victim not in {p["node_name"] for p in shrunk["parts"]}
    first, second = shrunk["attempts"]
    assert first["error"]["reason"] in ("peer_failure", "node_lost"), first
    assert first["ended"].startswith("resized after a lost machine"), first
    assert first["ended"].endswith("3 -> 2")
    # From the latest step checkpoint: at most `every` steps trained again.
    assert second["resumed_from_step"] is not None and second["resumed_from_step"] >= every
    assert second["world_size"] == 2 and second["global_batch"] == 128

    hosts.link_up(victim)
    healed_at = time.monotonic()
    grown = jobs.wait(
        job_id,
        lambda j: j["attempt"] == 3 and j["status"] == "running" and len(j["parts"]) == 3,
        90,
        "attempt 3 on three machines again",
    )
    grow_s = time.monotonic() - healed_at
    assert grown["attempts"][1]["ended"].startswith("resized (2 -> 3), stopped after step")
    assert grown["attempts"][2]["resumed_from_step"] == grown["attempts"][1]["stopped_at_step"]

    done = jobs.wait_done(job_id, timeout_s=240)
    assert done["status"] == "succeeded", done["error"]
    assert [a["world_size"] for a in done["attempts"]] == [3, 2, 3]
    # The recipe's one epoch ends near 98%: resizing costs none of it.
    accuracy = done["result"]["test_accuracy"]
    assert accuracy >= 0.97, accuracy
    record(
        "elastic 1..3 x 1: cut one of three hosts, then heal it (400 Mbit/s links)",
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        resize_interval_s=RESIZE_INTERVAL_S,
        checkpoint_every_steps=every,
        cut_to_training_on_two_s=round(shrink_s, 2),
        heal_to_running_on_three_s=round(grow_s, 2),
        world_sizes=[a["world_size"] for a in done["attempts"]],
        test_accuracy=accuracy,
    )


def test_a_checkpoint_slower_than_the_heartbeat_timeout_keeps_its_node_live(
    jobs: Jobs, three: tuple[TestHosts, LocalCluster]
) -> None:
    hosts, cluster = three
    # About 3.6 MB of checkpoint (model and Adadelta's state) at 1.5 Mbit/s:
    # some 20 s, over three heartbeat timeouts.
    for name in hosts.names:
        if name != "server":
            hosts.limit_rate(name, 1.5)
    job_id = jobs.submit(machines=1, processes=1, max_steps_per_epoch=10)
    job = jobs.wait_done(job_id, timeout_s=240)
    assert job["status"] == "succeeded", job["error"]
    assert job["attempt"] == 1
    name = node_of(job, 0)["node_name"]
    log = (cluster.state_dir / f"{name}.log").read_text()
    uploads = re.findall(r"checkpoint of epoch 1 uploaded \((\d+) bytes\) in ([\d.]+) s", log)
    assert uploads, f"no checkpoint upload in {name}'s log"
    size, seconds = int(uploads[-1][0]), float(uploads[-1][1])
    assert seconds > 2 * HEARTBEAT_TIMEOUT_S, f"the upload took only {seconds} s"
    with cluster.client() as client:
        nodes = client.get("/nodes").json()["data"]
    assert all(n["state"] == "live" for n in nodes), nodes
    record(
        "checkpoint upload over a 1.5 Mbit/s link",
        checkpoint_bytes=size,
        upload_s=seconds,
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        node_lost=False,
    )


def test_two_workers_without_an_address_on_three_hosts_train_across_them(
    mnist_dir: Path, tmp_path: Path
) -> None:
    """The server and two workers on three hosts, no --address and no
    interface variable: each worker advertises its route to the server."""
    with hosted_cluster(tmp_path, mnist_dir, workers=2, advertise_address=False) as (
        hosts,
        cluster,
    ):
        with cluster.client() as client:
            nodes = {n["name"]: n for n in client.get("/nodes").json()["data"]}
            for name in ("node-0", "node-1"):
                # The host name resolves to loopback there; the node still
                # advertises the address its peers reach it at.
                assert nodes[name]["address"] == hosts.address(name)
                # Its share of the cores the test hosts share.
                assert nodes[name]["cpus"] == max(1, cores.usable_cpus() // 2)
            steps = 20
            before = {name: hosts.bytes_moved(name) for name in hosts.names}
            job_id = Jobs(client).submit(
                machines=2, processes=1, batch_size=64, max_steps_per_epoch=steps
            )
            job = Jobs(client).wait_done(job_id)
        assert_trained_across_hosts(hosts, job, before, steps)


def namespaces() -> set[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return {line.split()[0] for line in listing.stdout.splitlines() if line.strip()}


def test_local_cluster_on_test_hosts_runs_a_job_across_them_and_cleans_up(
    mnist_dir: Path, tmp_path: Path
) -> None:
    require_test_hosts()
    before = namespaces()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "local-cluster",
            "--hosts",
            "--link-mbit",
            "1000",
            "--machines",
            "2",
            "--max-steps-per-epoch",
            "10",
            "--data-dir",
            str(mnist_dir),
            "--state-dir",
            str(tmp_path / "state"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    addresses = re.findall(r"test host (node-\d) at (\d+\.\d+\.\d+\.\d+)", done.stdout)
    assert len(addresses) == 2, done.stdout
    assert "job 1 succeeded" in done.stdout
    for name, _ in addresses:
        assert re.search(rf"machine \d on {name}: succeeded", done.stdout), done.stdout
    assert namespaces() == before, "test hosts left behind"
