"""Workers started by a real Slurm (issue 31): slurmctld and munged on this
machine, a slurmd on each of two test hosts (tests/e2e/slurm.py), the ddpo
server on a third host. README's "On Slurm" lines run as written, one by one,
as a user would: ``sbatch deploy/slurm/ddpo-workers.sbatch`` puts a worker on
each Slurm node, a 2 x 1 job trains across them, ``scancel`` of the
allocation makes the workers leave (the job stops at a step and goes back to
the queue, charged nothing), and the next allocation resumes it from that
step. A second test shortens the walltime: the workers leave before it, on
the script's ``--signal``, and the allocation ends on its own.

CI sets DDPO_REQUIRE_SLURM: there these tests never skip."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli.cluster import LocalCluster
from cli.hosts import TestHosts
from tests.conftest import REPO
from tests.e2e import slurm
from tests.e2e.conftest import Jobs, record, until
from tests.e2e.test_multihost import require_test_hosts
from tests.e2e.test_readme import as_here, shell_blocks

SLURM = "### On Slurm"
SCRIPT = REPO / "deploy" / "slurm" / "ddpo-workers.sbatch"
NODES = ["n1", "n2"]


def require_slurm() -> None:
    require_test_hosts()
    reason = slurm.unavailable_reason()
    if reason is None:
        return
    if os.environ.get("DDPO_REQUIRE_SLURM"):
        pytest.fail(f"DDPO_REQUIRE_SLURM is set but Slurm cannot run here: {reason}")
    pytest.skip(f"Slurm unavailable: {reason}")


@dataclass
class Site:
    """An HPC site: a Slurm cluster, a ddpo server outside it, and a user's
    shell on the login node (a directory on the shared filesystem)."""

    hosts: TestHosts
    slurm: slurm.SlurmCluster
    ddpo: LocalCluster
    home: Path

    @property
    def env(self) -> dict[str, str]:
        """The user's shell: Slurm's commands, ddpo installed (this
        virtualenv on PATH), the server and its tokens exported."""
        assert self.ddpo.tokens is not None
        bin_dir = str(Path(sys.executable).parent)
        return {
            **{k: v for k, v in self.slurm.env.items() if not k.startswith("DDPO_")},
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "DDPO_SERVER_URL": self.ddpo.url,
            "DDPO_JOIN_TOKEN": self.ddpo.tokens.join,
            "DDPO_DATA_DIR": str(self.ddpo.data_dir),
            **self.ddpo.cli_env(),
        }

    def run(self, line: str, timeout_s: float = 60) -> str:
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", line],
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        assert done.returncode == 0, f"{line}\nfailed with {done.returncode}:\n{done.stderr}"
        return done.stdout

    def allocations(self) -> list[str]:
        """The ids of the ddpo-workers allocations in Slurm's queue."""
        listing = self.slurm.command("squeue", "-h", "--name=ddpo-workers", "-o", "%i").stdout
        return listing.split()

    def live_nodes(self, jobs: Jobs) -> set[str]:
        nodes = jobs.client.get("/nodes").json()["data"]
        return {n["name"] for n in nodes if n["state"] == "live" and n["drain"] is None}


@pytest.fixture(scope="module")
def site(mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    require_slurm()
    home = tmp_path_factory.mktemp("slurm-home")
    with (
        TestHosts(["server", *NODES]) as hosts,
        LocalCluster(
            state_dir=tmp_path_factory.mktemp("slurm-server"),
            data_dir=mnist_dir,
            workers=0,
            hosts=hosts,
        ) as ddpo,
        slurm.SlurmCluster(hosts, NODES, tmp_path_factory.mktemp("slurm")) as cluster,
    ):
        try:
            yield Site(hosts, cluster, ddpo, home)
        finally:
            # What the workers printed, for a failed test's report.
            for out in sorted(home.glob("ddpo-workers-*.out")):
                print(f"--- {out.name}:\n{out.read_text(errors='replace')[-3000:]}")


@pytest.fixture
def jobs(site: Site) -> Iterator[Jobs]:
    with site.ddpo.client("admin") as client:
        yield Jobs(client)
        for job in client.get("/jobs", params={"limit": 500}).json()["data"]:
            if job["status"] in ("queued", "running"):
                client.post(f"/jobs/{job['id']}/cancel")
    site.slurm.command("scancel", "--name=ddpo-workers")
    until(lambda: not site.allocations(), slurm.KILL_WAIT_S + 30, "no allocation left")


def readme_lines() -> list[str]:
    (block,) = shell_blocks(SLURM)
    return [line for line in block.splitlines() if line.strip()]


def command(line: str, mnist_dir: Path) -> str:
    """The line as this checkout runs it: the script where it is, the
    comment dropped."""
    line = as_here(line, mnist_dir).replace(" deploy/slurm/", f" {SCRIPT.parent}/")
    return line.split("  #")[0].strip()


def at_step(jobs: Jobs, job_id: int, step: int) -> dict[str, Any]:
    return jobs.wait(
        job_id,
        lambda j: j["status"] == "running" and ((j["progress"] or {}).get("batch") or 0) >= step,
        180,
        f"step {step}",
    )


@pytest.mark.timeout(600)
def test_readmes_slurm_lines_a_2x1_job_across_slurm_nodes_survives_scancel(
    site: Site, jobs: Jobs, mnist_dir: Path
) -> None:
    lines = readme_lines()
    expected = ["sbatch", "squeue", "ddpo nodes", "ddpo submit", "scancel", "sbatch"]
    assert [next(w for w in expected if line.startswith(w)) for line in lines] == expected, lines
    sbatch, squeue, nodes, submit, scancel, again = (command(line, mnist_dir) for line in lines)

    # A worker on each Slurm node, under Slurm's node names, with the CPUs
    # Slurm allocated and their own hosts' addresses.
    allocation = re.search(r"Submitted batch job (\d+)", site.run(sbatch))
    assert allocation is not None
    until(lambda: site.live_nodes(jobs) == set(NODES), 90, "a worker on each Slurm node")
    assert allocation[1] in site.run(squeue)
    listed = site.run(nodes)
    assert all(name in listed for name in NODES), listed
    registered = {n["name"]: n for n in jobs.client.get("/nodes").json()["data"]}
    for name in NODES:
        assert registered[name]["address"] == site.hosts.address(name)
        assert registered[name]["cpus"] == site.slurm.cpus_per_node

    # The 2 x 1 job trains across the two Slurm nodes, over the bridge.
    job_id = int(site.run(f"{submit} -q").strip())
    job = at_step(jobs, job_id, 20)
    assert {p["node_name"] for p in job["parts"]} == set(NODES)
    assert len({p["node_address"] for p in job["parts"]}) == 2

    # scancel: Slurm sends SIGTERM to the workers, they leave. The job stops
    # at a step with a checkpoint and goes back to the queue, no restart used.
    cancelled = time.monotonic()
    site.run(scancel)
    stopped = jobs.wait(
        job_id,
        lambda j: j["status"] == "queued" and len(j["attempts"]) == 1 and j["attempts"][0]["ended"],
        slurm.KILL_WAIT_S + 30,
        "the job back in the queue",
    )
    back_in_queue_s = time.monotonic() - cancelled
    (first,) = stopped["attempts"]
    step = first["stopped_at_step"]
    assert step is not None and step >= 20, json.dumps(stopped, indent=1)
    assert re.fullmatch(rf"node leaving \(node n[12]\), stopped after step {step}", first["ended"])
    assert first["error"] is None and stopped["error"] is None
    # The workers exited by themselves before Slurm's KillWait: the
    # allocation is gone, nothing hangs.
    until(lambda: not site.allocations(), slurm.KILL_WAIT_S + 30, "the allocation to end")
    allocation_gone_s = time.monotonic() - cancelled
    out = (site.home / f"ddpo-workers-{allocation[1]}.out").read_text(errors="replace")
    assert "Killed" not in out, out

    # The next allocation: the same nodes come back under their names
    # (their credentials), and the job resumes from the step it stopped at.
    site.run(again)
    done = jobs.wait_done(job_id, 300)
    assert done["status"] == "succeeded", done
    second = done["attempts"][-1]
    assert second["resumed_from_step"] == step and len(done["attempts"]) == 2
    assert done["spec"]["max_restarts"] == 0  # and none was needed
    assert {n["name"] for n in jobs.client.get("/nodes").json()["data"]} == set(NODES)
    record(
        "slurm_scancel",
        back_in_queue_s=round(back_in_queue_s, 2),
        allocation_gone_s=round(allocation_gone_s, 2),
        stopped_at_step=step,
    )


@pytest.mark.timeout(400)
def test_at_the_walltime_the_workers_leave_first_and_the_allocation_ends_on_its_own(
    site: Site, jobs: Jobs
) -> None:
    """``--time=3`` on the command line (it wins over the script's): the
    script's own ``--signal=TERM@120`` comes a minute in (Slurm may send it
    up to a minute early), two before the walltime."""
    # The last allocation's workers left idle and said so: a job submitted
    # now waits for the next allocation, rather than being placed on nodes
    # that are gone (and failing when their next workers register).
    left = jobs.client.get("/nodes").json()["data"]
    assert {n["name"]: (n["drain"] or {}).get("reason") for n in left} == dict.fromkeys(
        NODES, "node_leaving"
    ), left
    job_id = jobs.submit(machines=2, epochs=30, batch_size=64)  # longer than the walltime
    assert jobs.get(job_id)["status"] == "queued"
    out = site.run(f"sbatch --time=3 --nodes=2 {SCRIPT}")
    allocation = re.search(r"Submitted batch job (\d+)", out)
    assert allocation is not None
    submitted = time.monotonic()
    job = at_step(jobs, job_id, 5)
    assert len(job["attempts"]) == 1 and {p["node_name"] for p in job["parts"]} == set(NODES)
    stopped = jobs.wait(
        job_id,
        lambda j: j["status"] == "queued" and len(j["attempts"]) == 1 and j["attempts"][0]["ended"],
        150,
        "the workers to leave before the walltime",
    )
    assert stopped["attempts"][0]["ended"].startswith("node leaving"), stopped["attempts"]
    assert stopped["error"] is None
    until(lambda: not site.allocations(), 60, "the allocation to end")
    ended_s = time.monotonic() - submitted
    # Ended by its workers leaving (a walltime would say TIMEOUT); not killed.
    state = site.slurm.command("scontrol", "show", "job", allocation[1], "-o").stdout
    assert "JobState=COMPLETED" in state, state
    out = (site.home / f"ddpo-workers-{allocation[1]}.out").read_text(errors="replace")
    assert "Killed" not in out, out
    record("slurm_walltime", allocation_ended_s=round(ended_s, 2))
