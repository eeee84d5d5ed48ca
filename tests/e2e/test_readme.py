"""README's "A cluster to play with, then curl", "The command line" and
"Scaling studies", run as written: the kept local cluster in one shell,
every curl and CLI line in another. Only the data
directory is replaced (README's ../shared/data is relative to a clone)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from cli.cluster import port_free
from cli.local_cluster import KEPT_PORT
from ddpo import kept
from tests.conftest import REPO
from tests.e2e.conftest import until

pytestmark = pytest.mark.e2e

CURL = "### A cluster to play with, then curl"
CLI = "### The command line"
STUDIES = "### Scaling studies"
PEOPLE = "### People: keys, owners and the audit log"
PREEMPTION = "### Preemption, drain and stopping at a step"
ELASTIC = "### Elastic jobs"
CLIENT = "### From Python: `ddpo.Client`"
OWN_TRAINING = "### Your own training"
SWEEPS = "### Sweeps"


def shell_blocks(heading: str, language: str = "sh") -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index(heading) + len(heading) :]
    section = re.split(r"\n##+ ", section, maxsplit=1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def as_here(line: str, mnist_dir: Path) -> str:
    """A README command line as this checkout runs it: its virtualenv's
    ddpo, the data directory and the example scripts where they are."""
    line = line.replace(".venv/bin/ddpo", f"{sys.executable} -m cli")
    line = line.replace("../shared/data", str(mnist_dir))
    line = line.replace(" examples/sweeps", f" {REPO / 'examples/sweeps'}")
    return line.replace(" examples/scripts", f" {REPO / 'examples/scripts'}")


def run_the_first_command(mnist_dir: Path, cwd: Path, env: dict[str, str]) -> None:
    """README's command 1 (its job, cut short): what a user has run before
    the sections after it, so their cluster's database is not empty."""
    block = shell_blocks("## Two commands")[0]
    (line,) = [line for line in block.splitlines() if "ddpo local-cluster" in line]
    first = line.split("&& ")[-1]
    assert first == ".venv/bin/ddpo local-cluster --data-dir ../shared/data", first
    shown = succeeded(
        ["bash", "-c", f"{as_here(first, mnist_dir)} --max-steps-per-epoch 10"], cwd, env
    )
    assert "job 1 succeeded" in shown, shown


def succeeded(command: list[str], cwd: Path, env: dict[str, str], timeout_s: float = 400) -> str:
    """What ``command`` printed, once it has exited 0."""
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@contextlib.contextmanager
def kept_cluster(
    mnist_dir: Path,
    cwd: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    after_the_first_command: bool = False,
    start: str | None = None,
    **settings: str,
) -> Iterator[tuple[dict[str, str], kept.KeptCluster]]:
    """README's first terminal: ``ddpo local-cluster --keep --workers 2``, as
    written in its curl section (or ``start``); the environment of the second
    terminal. ``after_the_first_command``: in the directory where README's
    command 1 ran its job (the kept cluster reuses ./local-cluster)."""
    if not port_free(KEPT_PORT):
        pytest.fail(f"README's examples need localhost:{KEPT_PORT}, which is taken here")
    start = start or shell_blocks(CURL)[0].splitlines()[1]
    assert start.startswith(".venv/bin/ddpo local-cluster --keep"), start
    start = as_here(start, mnist_dir)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DDPO_")},
        "DDPO_CLUSTER_FILE": str(cwd / "cluster.json"),
        "PYTHONPATH": str(REPO),
    }
    # ``settings``: the server's (the cluster's processes inherit them).
    env.update(settings)
    monkeypatch.setenv("DDPO_CLUSTER_FILE", env["DDPO_CLUSTER_FILE"])
    if after_the_first_command:
        run_the_first_command(mnist_dir, cwd, env)
    with subprocess.Popen(
        ["bash", "-c", f"exec {start}"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as keeper:
        try:
            found = until(kept.read, 120, "the kept cluster")
            yield env, found
        finally:
            keeper.send_signal(signal.SIGINT)  # Ctrl-C: it stops what it started
            try:
                code = keeper.wait(60)
            except subprocess.TimeoutExpired:
                keeper.kill()  # its server and workers die with it (PR_SET_PDEATHSIG)
                keeper.wait()
                raise
        assert code == 0, keeper.stdout.read() if keeper.stdout else code


def run_block(
    prelude: str, block: str, cwd: Path, env: dict[str, str], timeout_s: float = 120
) -> str:
    """The block in bash, stopping at the first line that fails."""
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", f"{prelude}\n{block}"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, f"{block}\nfailed with {done.returncode}:\n{done.stderr}"
    return done.stdout


def test_readmes_kept_cluster_and_curl_lines_work_as_written(
    mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup, submit_and_read, after_the_job = shell_blocks(CURL)
    assert setup.splitlines()[-1] == "source local-cluster/tokens.env"
    with kept_cluster(mnist_dir, tmp_path, monkeypatch, after_the_first_command=True) as (
        env,
        found,
    ):
        prelude = "source local-cluster/tokens.env"
        shown = run_block(prelude, submit_and_read, tmp_path, env)
        assert '"name":"mnist-2x1"' in shown.replace(" ", "")
        headers = {"Authorization": f"Bearer {found.token}"}
        jobs = httpx.get(f"{found.server}/jobs", headers=headers, timeout=10).json()["data"]
        by_name = {j["name"]: j for j in jobs}
        job_id = by_name["mnist-2x1"]["id"]
        nightly = next(j for j in jobs if j["spec"]["max_run_seconds"] == 3600)
        assert job_id > 1 and nightly["status"] in ("cancelled", "cancelling"), nightly
        # Command 1's job stays as it was: the lines touch only their own jobs.
        assert httpx.get(f"{found.server}/jobs/1", headers=headers).json()["status"] == (
            "succeeded"
        )
        deadline = time.monotonic() + 240
        while True:  # as a user waits for the job to end
            job = httpx.get(f"{found.server}/jobs/{job_id}", headers=headers, timeout=10).json()
            if job["status"] in ("succeeded", "failed", "cancelled"):
                break
            assert time.monotonic() < deadline, f"job {job_id} did not end: {job}"
            time.sleep(1)
        assert job["status"] == "succeeded", job["error"]
        # The second block, in the same shell as the first: $JOB is still set.
        shown = run_block(prelude, after_the_job, tmp_path, {**env, "JOB": str(job_id)})
        assert "Test set: average loss" in shown
        checkpoint = torch.load(tmp_path / "model.pt", weights_only=False)
        assert "model" in checkpoint

        # Keys, owners and the audit log, on the same cluster.
        (people,) = shell_blocks(PEOPLE)
        shown = run_block(f"{prelude}\nsource {sys.prefix}/bin/activate", people, tmp_path, env)
        compact = shown.replace(" ", "")
        assert '{"name":"alice","role":"user"}' in compact
        assert '"owner":"alice"' in compact and '"action":"job.submit"' in compact
        assert '"revoked_by":"token:admin"' in compact
        assert "a valid bearer token is needed" in shown  # alice's key, once revoked
        assert "key 2: bob (reader)" in shown and "key 2 (bob) revoked" in shown
        audit = [line.split() for line in shown.splitlines() if "key.create" in line]
        # id, date, time, who, from, action, target ("key N"), detail; newest first.
        assert [(row[3], row[5], " ".join(row[6:8])) for row in audit] == [
            ("token:admin", "key.create", "key 2"),
            ("token:admin", "key.create", "key 1"),
        ], audit


@pytest.mark.timeout(900)  # every CLI line, the study and a one-shot cluster included
def test_readmes_cli_lines_work_as_written(
    mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (block,) = shell_blocks(CLI)
    with kept_cluster(mnist_dir, tmp_path, monkeypatch, after_the_first_command=True) as (
        env,
        found,
    ):
        # The second terminal activates this checkout's virtualenv.
        prelude = f"source {sys.prefix}/bin/activate"
        block = block.replace("source .venv/bin/activate\n", "")
        block = block.replace("../shared/data", str(mnist_dir))
        shown = run_block(prelude, block, tmp_path, env, timeout_s=600)
        headers = {"Authorization": f"Bearer {found.token}"}
        first = httpx.get(f"{found.server}/jobs/1", headers=headers, timeout=10).json()
    assert first["status"] == "succeeded" and first["name"] is None  # command 1's, untouched
    waited = re.search(r"^job (\d+) succeeded: ", shown, re.M)  # submit --wait's summary
    assert waited and int(waited.group(1)) > 1, shown
    assert re.search(r"^job (\d+) cancell", shown, re.M), shown  # the nightly job, cancelled
    assert re.search(r"^1 x 2 .* succeeded$", shown, re.M), shown  # the study's table
    assert "Test set: average loss" in shown  # logs
    assert re.search(r"^job \d+'s model: model.pt \(", shown, re.M), shown
    assert "conv1.weight" in torch.load(tmp_path / "model.pt", weights_only=False)["model"]
    assert "job 1 succeeded" in shown  # the one-shot local cluster's own job


@pytest.mark.timeout(900)  # three short studies, one on a cluster of its own
def test_readmes_scaling_study_lines_work_as_written(
    mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (block,) = shell_blocks(STUDIES)
    with kept_cluster(mnist_dir, tmp_path, monkeypatch) as (env, found):
        prelude = f"source local-cluster/tokens.env\nsource {sys.prefix}/bin/activate"
        block = block.replace("../shared/data", str(mnist_dir))
        shown = run_block(prelude, block, tmp_path, env, timeout_s=600)
        headers = {"Authorization": f"Bearer {found.token}"}
        studies = [
            httpx.get(f"{found.server}/studies/{i}", headers=headers, timeout=10).json()
            for i in (1, 2, 3)
        ]
    posted, default, machines = studies
    assert posted["status"] in ("cancelled", "cancelling"), posted  # curl's cancel
    assert [(r["num_processes"], r["batch_size"]) for r in default["rows"]] == [
        (1, 128),
        (2, 64),
        (4, 32),
        (8, 16),
    ]
    assert default["status"] == "succeeded", default
    assert default["spec"]["max_steps_per_epoch"] == 100
    assert machines["status"] == "succeeded", machines
    assert [r["num_machines"] for r in machines["rows"]] == [1, 1, 2, 2]
    assert re.search(r"^2 x 2 .* succeeded$", shown, re.M), shown  # the table of rows on machines
    assert len(re.findall(r"^1 x 8 .* succeeded$", shown, re.M)) == 2, (
        shown
    )  # ddpo study, local-cluster


@pytest.mark.timeout(900)  # three sweeps: 12 trials, 6, and one cancelled
def test_readmes_sweep_lines_work_as_written(
    mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = shell_blocks(SWEEPS)[0]
    with kept_cluster(mnist_dir, tmp_path, monkeypatch) as (env, found):
        prelude = f"source local-cluster/tokens.env\nsource {sys.prefix}/bin/activate"
        shown = run_block(prelude, as_here(block, mnist_dir), tmp_path, env, timeout_s=800)
        headers = {"Authorization": f"Bearer {found.token}"}
        curl, from_file, cancelled = (
            httpx.get(f"{found.server}/sweeps/{i}", headers=headers, timeout=10).json()
            for i in (1, 2, 3)
        )
        listed = httpx.get(f"{found.server}/sweeps", headers=headers, timeout=10).json()
    assert curl["status"] == "succeeded" and len(curl["trials"]) == 12, curl
    assert curl["counts"]["pruned"] >= 4, curl["counts"]
    assert from_file["status"] == "succeeded" and from_file["name"] == "lr, asha"
    assert len(from_file["trials"]) == 6 and from_file["sampler"]["kind"] == "tpe"
    assert cancelled["status"] == "cancelled"
    assert set(cancelled["space"]) == {"lr", "seed"} and cancelled["max_trials"] == 8
    assert [s["id"] for s in listed["data"]] == [3, 2, 1]
    # ddpo sweep show --watch ends on the finished table, the best starred.
    best = curl["best"]["number"]
    assert re.search(rf"^\*\s+{best}\s+{curl['best']['job_id']}\s", shown, re.M), shown
    assert "sweep 1 succeeded: 12 of 12 trial(s)" in shown
    assert f"best: trial {best} (job {curl['best']['job_id']})" in shown


@pytest.mark.timeout(600)
def test_readmes_preemption_and_drain_lines_work_as_written(
    mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (block,) = shell_blocks(PREEMPTION)
    # The lines as written; the server does not make the urgent job wait out
    # the long one's minimum run time (60 s: tests/api/test_preemption.py).
    with kept_cluster(mnist_dir, tmp_path, monkeypatch, DDPO_PREEMPTION_MIN_RUN_S="0") as (
        env,
        found,
    ):
        prelude = f"source local-cluster/tokens.env\nsource {sys.prefix}/bin/activate"
        shown = run_block(prelude, block, tmp_path, env, timeout_s=480)
        headers = {"Authorization": f"Bearer {found.token}"}
        long_job = httpx.get(f"{found.server}/jobs/1", headers=headers, timeout=10).json()
        urgent = httpx.get(f"{found.server}/jobs/2", headers=headers, timeout=10).json()
    assert "job 2 succeeded" in shown, shown  # the urgent job, followed with --wait
    preempted = re.search(
        r"  1: 2 rank\(s\), global batch \d+, from the start: preempted by job 2, stopped "
        r"after step (\d+)",
        shown,
    )
    assert preempted, shown
    assert f"  2: 2 rank(s), global batch 256, from step {preempted.group(1)}" in shown, shown
    assert re.search(r"node-1 .* (draining|drained) ", shown), shown
    assert long_job["status"] in ("cancelled", "cancelling"), long_job
    endings = [a["ended"] or "" for a in long_job["attempts"]]
    assert endings[0].startswith("preempted by job 2, stopped after step")
    assert endings[1].startswith("drained (node node-1)"), endings
    assert long_job["spec"]["max_restarts"] == 0 and long_job["error"] is None
    assert urgent["status"] == "succeeded"


@pytest.mark.timeout(600)
def test_readmes_elastic_lines_work_as_written(
    mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (block,) = shell_blocks(ELASTIC)
    with kept_cluster(mnist_dir, tmp_path, monkeypatch, DDPO_RESIZE_INTERVAL_S="5") as (
        env,
        found,
    ):
        prelude = f"source local-cluster/tokens.env\nsource {sys.prefix}/bin/activate"
        run_block(prelude, block, tmp_path, env, timeout_s=120)
        with httpx.Client(
            base_url=found.server,
            headers={"Authorization": f"Bearer {found.token}"},
            timeout=10,
        ) as client:

            def ended_job(job_id: int) -> dict[str, Any] | None:
                job: dict[str, Any] = client.get(f"/jobs/{job_id}").json()
                return None if job["status"] in ("queued", "running") else job

            ended = {j: until(lambda j=j: ended_job(j), 300, f"job {j} to end") for j in (1, 2)}
    elastic, second = ended[1], ended[2]
    assert elastic["status"] == "succeeded", elastic["error"]
    assert [a["num_machines"] for a in elastic["attempts"]] == [1, 2], elastic["attempts"]
    assert elastic["attempts"][0]["ended"].startswith("resized (1 -> 2), stopped after step")
    assert elastic["attempts"][1]["global_batch"] == 2 * 128
    assert second["status"] == "succeeded", second["error"]
    assert second["spec"]["topology"] == {"num_machines": 1, "max_machines": 2, "num_processes": 1}


@pytest.mark.timeout(600)
def test_readmes_client_scripts_run_as_written(
    mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both Python examples, as files a user saves and runs, on the kept
    cluster after command 1's job."""
    sync_example, async_example = shell_blocks(CLIENT, "python")
    with kept_cluster(mnist_dir, tmp_path, monkeypatch, after_the_first_command=True) as (
        env,
        found,
    ):
        shown = {}
        for name, code in (("sync", sync_example), ("async", async_example)):
            (tmp_path / f"{name}.py").write_text(code)
            shown[name] = succeeded([sys.executable, f"{name}.py"], tmp_path, env)
        headers = {"Authorization": f"Bearer {found.token}"}
        first = httpx.get(f"{found.server}/jobs/1", headers=headers, timeout=10).json()
    assert first["status"] == "succeeded"
    lines = shown["sync"].splitlines()
    assert any("Test set: average loss" in line for line in lines), lines
    assert re.search(r"^test accuracy \d+\.\d+%$", shown["sync"], re.M), lines
    assert "failed: deadline" in lines and "invalid: ['topology.num_machines']" in lines, lines
    listed = next(line for line in lines if line.startswith("["))
    assert 1 in json.loads(listed), listed  # command 1's job, among the succeeded
    assert "conv1.weight" in torch.load(tmp_path / "model.pt", weights_only=False)["model"]
    assert re.fullmatch(r"\['\d+\.\d+%', '\d+\.\d+%'\]\n", shown["async"]), shown["async"]


@pytest.mark.timeout(600)
def test_readmes_script_lines_work_as_written(
    mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (block,) = shell_blocks(OWN_TRAINING)
    lines = block.splitlines()
    start = next(line for line in lines if line.startswith(".venv/bin/ddpo local-cluster"))
    assert "--script-dir examples/scripts" in start
    second = block[block.index("# Terminal 2:") :]
    second = second.replace("source .venv/bin/activate", f"source {sys.prefix}/bin/activate")
    with kept_cluster(
        mnist_dir, tmp_path, monkeypatch, after_the_first_command=True, start=start
    ) as (env, _found):
        shown = run_block("", second, tmp_path, env, timeout_s=480)
    assert "torchrun_mlp.py" in shown  # ddpo trainers
    assert re.search(
        r"^job \d+ succeeded: 2 machine\(s\) x 1 process\(es\), script "
        r"torchrun_mlp.py --epochs 1, gloo$",
        shown,
        re.M,
    ), shown
    assert shown.count("succeeded: 2 machine(s) x 1 process(es), script torchrun_mlp.py") == 2
