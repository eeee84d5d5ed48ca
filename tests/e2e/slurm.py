"""A real Slurm cluster on test hosts (cli/hosts.py), for the tests that
start workers the way an HPC site would: Debian's munged and slurmctld on
this machine, listening on the hosts' bridge, and one slurmd per test host,
each in its host's network namespace under its own host name. ``srun -N2``
then runs one task on each host, each with its host's address.

Everything lives in one directory of the test's (the munge key and socket,
slurm.conf, spool, state and logs) and on ports of its own, so it never
touches a Slurm this machine may already run; :meth:`SlurmCluster.stop`
cancels what is left and stops every daemon.

Why ``nsenter --net`` plus ``unshare --uts`` rather than ``ip netns exec``:
the latter remounts /sys for the namespace, which hides the cgroup mounts
slurmd looks at on start.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from cli.cluster import free_port
from cli.hosts import TestHosts

DAEMONS = (
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "scancel",
    "squeue",
    "sinfo",
    "scontrol",
)
# Long enough for a worker's leave (DDPO_WORKER_LEAVE_GRACE_S plus its
# stop grace) before the SIGKILL: Slurm's own default.
KILL_WAIT_S = 30


class SlurmUnavailable(RuntimeError):
    """Slurm or munge is not installed here."""


def unavailable_reason() -> str | None:
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (Debian: apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "running slurmd needs root"
    return None


@dataclass
class SlurmCluster:
    """slurmctld on the bridge, a slurmd on each of ``nodes`` (test hosts
    whose names are also their Slurm node names)."""

    hosts: TestHosts
    nodes: list[str]
    directory: Path
    cpus_per_node: int = 1
    partition: str = "ddpo"
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What Slurm's commands (sbatch, squeue, scancel) need to find this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout_s: float = 60) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise SlurmUnavailable(reason)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        try:
            self._start_munge()
            self._write_conf()
            self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
            for node in self.nodes:
                namespace = self.hosts.hosts[node].namespace
                # The node's own host name (its UTS namespace), on its own network.
                inner = f"hostname {node} && exec slurmd -D -f {self.conf} -N {node}"
                argv = ["nsenter", f"--net=/run/netns/{namespace}", "unshare", "--uts"]
                self._spawn([*argv, "sh", "-c", inner], f"slurmd-{node}")
            self.wait_idle(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, argv: list[str], log_name: str) -> None:
        log = open(self.directory / f"{log_name}.out", "wb")  # noqa: SIM115 (kept by Popen)
        self.processes.append(
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )
        log.close()

    def _start_munge(self) -> None:
        key = self.directory / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        self._spawn(
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.directory / 'munged.pid'}",
                f"--log-file={self.directory / 'munged.log'}",
                f"--seed-file={self.directory / 'munged.seed'}",
            ],
            "munged",
        )
        deadline = time.monotonic() + 20
        while not self.munge_socket.exists():
            if time.monotonic() > deadline or self.processes[-1].poll() is not None:
                raise SlurmUnavailable(f"munged did not start: {self.log_tail('munged.log')}")
            time.sleep(0.05)

    @property
    def munge_socket(self) -> Path:
        return self.directory / "munge.socket"

    def _write_conf(self) -> None:
        d = self.directory
        (d / "state").mkdir(exist_ok=True)
        node_lines = [
            f"NodeName={node} NodeAddr={self.hosts.address(node)} "
            f"CPUs={self.cpus_per_node} RealMemory=1000 State=UNKNOWN"
            for node in self.nodes
        ]
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=ddpotest",
                    # slurmctld insists on this machine's host name; the
                    # address is the bridge, where the hosts reach it.
                    f"SlurmctldHost={socket.gethostname()}({self.hosts.gateway})",
                    f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    f"StateSaveLocation={d / 'state'}",
                    f"SlurmdSpoolDir={d / 'spool-%n'}",
                    f"SlurmctldPidFile={d / 'slurmctld.pid'}",
                    f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
                    f"SlurmctldLogFile={d / 'slurmctld.log'}",
                    f"SlurmdLogFile={d / 'slurmd-%n.log'}",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "MpiDefault=none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "SchedulerType=sched/backfill",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "ReturnToService=2",
                    f"KillWait={KILL_WAIT_S}",
                    "MinJobAge=300",
                    *node_lines,
                    f"PartitionName={self.partition} Nodes={','.join(self.nodes)} "
                    "Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

    # --- asking it ----------------------------------------------------------------

    def command(self, *argv: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def node_states(self) -> dict[str, str]:
        listing = self.command("sinfo", "-h", "-N", "-o", "%N %t").stdout
        return dict(line.split() for line in listing.splitlines() if line.strip())

    def wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise SlurmUnavailable(f"{process.args!r} exited: {self.logs()}")
            states = self.node_states()
            if all(states.get(node) == "idle" for node in self.nodes):
                return
            time.sleep(0.2)
        raise SlurmUnavailable(f"nodes not idle after {timeout_s} s: {states}; {self.logs()}")

    def job_state(self, job_id: str) -> str | None:
        """squeue's state of the allocation, None once it has left the queue."""
        out = self.command("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip()
        return out or None

    def log_tail(self, name: str, chars: int = 2000) -> str:
        path = self.directory / name
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def logs(self) -> str:
        names = ["slurmctld.log", *(f"slurmd-{n}.log" for n in self.nodes)]
        names += [f"slurmd-{n}.out" for n in self.nodes]
        return "\n".join(f"--- {n}:\n{self.log_tail(n)}" for n in names)

    # --- cleaning up ----------------------------------------------------------------

    def stop(self) -> None:
        if self.conf.exists():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self.command("scancel", "--full", f"--partition={self.partition}")
        for process in reversed(self.processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in reversed(self.processes):
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        self.processes.clear()
