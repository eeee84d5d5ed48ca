"""A server and K workers as real processes on this machine, on loopback.

Used by ``ddpo local-cluster``, by the end-to-end tests and by the
benchmarks, so all three exercise the same real processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

import httpx

from cli.api import Api
from cli.hosts import TestHosts
from ddpo import local_tokens
from ddpo.schemas import NodePublic, NodesPublic
from worker import cores


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on the port now. Bound as uvicorn
    binds (SO_REUSEADDR): connections of an earlier server there, closed
    and lingering in TIME_WAIT, do not keep a new one from listening."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class ManagedProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes]

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; always reaps."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def log_tail(self, chars: int = 3000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-chars:]


def _spawn(
    name: str,
    args: list[str],
    log_path: Path,
    env: Mapping[str, str],
    cwd: Path,
    on: Callable[[list[str]], list[str]] = lambda argv: argv,
) -> ManagedProcess:
    """Start ``python args`` (wrapped by ``on``: run it on a test host)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")  # noqa: SIM115 (closed by ManagedProcess.stop)
    process = subprocess.Popen(
        on([sys.executable, *args]),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        cwd=cwd,
        # Out of the terminal's process group: Ctrl-C reaches only the CLI,
        # which cancels its job and then stops these in order.
        start_new_session=True,
        # And never outlive it: killed outright, it takes them along.
        preexec_fn=_die_with_parent,
    )
    return ManagedProcess(name, process, log_path, log)


class StateDirInUse(RuntimeError):
    """Another local cluster runs on this state directory (its database, tokens)."""


def _hold_state_dir(state_dir: Path) -> IO[str]:
    """An exclusive lock on the state directory for the cluster's lifetime:
    two clusters on one database and one tokens file would ruin both."""
    lock = open(state_dir / "cluster.lock", "a+", encoding="utf-8")  # noqa: SIM115
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise StateDirInUse(
            f"{state_dir} is in use by the local cluster of {holder} (a `ddpo local-cluster "
            "--keep`?); give this one its own --state-dir"
        ) from None
    lock.truncate(0)
    lock.write(f"process {os.getpid()}\n")
    lock.flush()
    return lock


def _die_with_parent() -> None:
    from worker._process import die_with_parent

    die_with_parent(os.getppid(), sig=signal.SIGTERM)


SERVER_NICE = 10
# The test host the server runs on, and its port there.
SERVER_HOST = "server"
DEFAULT_PORT = 8000


@dataclass(frozen=True)
class ClusterTokens:
    """The tokens a local cluster's server accepts, one per role."""

    admin: str
    user: str
    read: str
    join: str

    @classmethod
    def generate(cls) -> ClusterTokens:
        return cls(*(secrets.token_urlsafe(32) for _ in range(4)))

    @classmethod
    def made_by_server(cls, token_file: Path) -> ClusterTokens:
        """The admin and join tokens a server started without tokens made:
        the admin token stands for every person's role."""
        made = local_tokens.read_token_file(token_file)
        if made is None:
            raise RuntimeError(f"the server made no tokens in {token_file}")
        return cls(admin=made.admin, user=made.admin, read=made.admin, join=made.join)

    def server_env(self) -> dict[str, str]:
        return {
            "DDPO_ADMIN_TOKEN": self.admin,
            "DDPO_USER_TOKEN": self.user,
            "DDPO_READ_TOKEN": self.read,
            "DDPO_JOIN_TOKEN": self.join,
        }

    def write_env_file(self, path: Path, url: str) -> None:
        """A file to ``source``: the CLI's DDPO_TOKEN and server, and every
        role's token. Readable by its owner only."""
        lines = [
            f"export DDPO_SERVER={url}",
            f"export DDPO_TOKEN={self.user}",
            *(f"export {name}={value}" for name, value in self.server_env().items()),
        ]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")


@dataclass
class LocalCluster:
    """Start with :meth:`start`, or use as a context manager; :meth:`stop`
    always terminates every process it started."""

    state_dir: Path
    data_dir: Path
    workers: int = 1
    worker_slots: int = 1
    port: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    worker_args: list[str] = field(default_factory=list)
    server_env: dict[str, str] = field(default_factory=dict)
    # Tokens on, as on any server: made at start unless given. False: an
    # open server (loopback only), for comparing with one.
    secure: bool = True
    tokens: ClusterTokens | None = None
    # Start the server with no tokens and take the ones it makes (what a
    # user who sets none gets); its workers find the join token themselves.
    server_makes_tokens: bool = False
    # Test hosts (cli/hosts.py): the server on the host named "server",
    # each worker on the host named as its node, each with its own address
    # and its share of this machine's cores. None: everything on loopback.
    hosts: TestHosts | None = None
    # On test hosts: pass each worker its host's address (False: let it
    # find its own, from its route to the server).
    advertise_address: bool = True
    # Each worker its share of this host's cores (core_share); False: every
    # worker takes them all, as separate hosts would.
    divide_cores: bool = True
    # None: a SQLite file in the state directory. A PostgreSQL URL lets
    # several servers (``replicas``) share the database; each listens on a
    # port of its own, and worker i speaks to server i % replicas first,
    # the others after it if that one cannot be reached.
    database: str | None = None
    replicas: int = 1
    server: ManagedProcess | None = None
    replica_processes: list[ManagedProcess] = field(default_factory=list)
    replica_ports: list[int] = field(default_factory=list)
    worker_processes: list[ManagedProcess] = field(default_factory=list)
    _lock: IO[str] | None = field(default=None, init=False, repr=False)
    _started_at: datetime | None = field(default=None, init=False, repr=False)

    @property
    def server_address(self) -> str:
        return self.hosts.address(SERVER_HOST) if self.hosts else "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.server_address}:{self.port}"

    def _on(self, host: str) -> Callable[[list[str]], list[str]]:
        hosts = self.hosts
        if hosts is None:
            return lambda argv: argv
        return lambda argv: hosts.command(host, argv)

    @property
    def database_path(self) -> Path:
        return self.state_dir / "ddpo.db"

    @property
    def database_url(self) -> str:
        return self.database or f"sqlite:///{self.database_path}"

    def replica_url(self, index: int) -> str:
        return f"http://{self.server_address}:{self.replica_ports[index]}"

    def server_urls_for(self, index: int) -> str:
        """Worker ``index``'s --server: its own replica first, then the rest."""
        if self.replicas == 1:
            return self.url
        order = [(index + k) % self.replicas for k in range(self.replicas)]
        return ",".join(self.replica_url(i) for i in order)

    @property
    def tokens_file(self) -> Path:
        return self.state_dir / "tokens.env"

    def headers(self, role: str = "user") -> dict[str, str]:
        """What a caller of this role sends: ``admin``, ``user``, ``read``."""
        if self.tokens is None:
            return {}
        return {"Authorization": f"Bearer {getattr(self.tokens, role)}"}

    def cli_env(self) -> dict[str, str]:
        """What the ``ddpo`` CLI needs in its environment to use this cluster."""
        return {
            "DDPO_SERVER": self.url,
            **({"DDPO_TOKEN": self.tokens.user} if self.tokens else {}),
        }

    def api(self, role: str = "user") -> Api:
        """The CLI's client of this cluster, as the given role."""
        return Api(self.url, getattr(self.tokens, role) if self.tokens else None)

    def client(self, role: str = "user", timeout_s: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout_s, headers=self.headers(role))

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 60.0) -> None:
        self.state_dir = self.state_dir.resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _hold_state_dir(self.state_dir)
        # A test host has nothing else listening: any port is free there.
        self.port = self.port or (DEFAULT_PORT if self.hosts else free_port())
        if self.secure and self.tokens is None and not self.server_makes_tokens:
            self.tokens = ClusterTokens.generate()
        if self.tokens is not None:
            self.tokens.write_env_file(self.tokens_file, self.url)
        try:
            self.start_server(timeout_s)
            for _ in range(1, self.replicas):
                self.start_replica(timeout_s)
            if self.server_makes_tokens:
                self.tokens = ClusterTokens.made_by_server(self.state_dir / "ddpo-tokens.env")
            # Registrations from now on carry a later time (the same clock).
            self._started_at = datetime.now(timezone.utc)
            for index in range(self.workers):
                self.start_worker(f"node-{index}")
            self.wait_for_nodes(self.workers, timeout_s)
        except BaseException:
            self.stop()
            raise

    def start_server(self, timeout_s: float = 60.0) -> ManagedProcess:
        """The (first) server, on ``port``."""
        self.server = self._start_api_server(self.port, "server", timeout_s)
        if not self.replica_processes:
            self.replica_processes.append(self.server)
            self.replica_ports.append(self.port)
        else:  # started again (after a kill)
            self.replica_processes[0] = self.server
        return self.server

    def start_replica(self, timeout_s: float = 60.0) -> ManagedProcess:
        """One more server on the same database, on a port of its own."""
        port = DEFAULT_PORT + len(self.replica_ports) if self.hosts else free_port()
        replica = self._start_api_server(port, f"server-{len(self.replica_ports)}", timeout_s)
        self.replica_processes.append(replica)
        self.replica_ports.append(port)
        return replica

    def _start_api_server(self, port: int, name: str, timeout_s: float) -> ManagedProcess:
        env = {
            **self.extra_env,
            "DATABASE_URL": self.database_url,
            # The server shares this host with the training it runs: it
            # yields the cores, so that being watched costs the training as
            # little as it can (BENCHMARKS.md, "50 dashboards").
            "DDPO_NICE": str(SERVER_NICE),
            **(self.tokens.server_env() if self.tokens and not self.server_makes_tokens else {}),
            # Not secure: an open server, said so (loopback only).
            **({} if self.secure else {"DDPO_NO_AUTH": "1"}),
            **self.server_env,
        }
        server = _spawn(
            name,
            ["-m", "api", "--host", self.server_address, "--port", str(port)],
            self.state_dir / f"{name}.log",
            env,
            self.state_dir,
            on=self._on(SERVER_HOST),
        )
        url = f"http://{self.server_address}:{port}"
        self._wait(
            lambda: httpx.get(f"{url}/healthz", timeout=2).status_code == 200,
            timeout_s,
            f"{name} to answer /healthz",
            server,
        )
        return server

    def worker_placement(self, name: str) -> list[str]:
        """Where a worker says it is (loopback, or its test host's address),
        and its share of the cores the workers share."""
        cpus = self.core_share(name)
        if self.hosts is None:
            return ["--address", "127.0.0.1", *cpus]
        advertised = ["--address", self.hosts.address(name)] if self.advertise_address else []
        return [*advertised, *cpus]

    def core_share(self, name: str) -> list[str]:
        """Workers on one host divide its cores: each counts its share
        (``--cpus``: threads per rank follow) and, where the OS allows, runs
        on a disjoint set of CPUs of its own (``--cpu-set``), so that jobs
        at once run at the speed of their share instead of every worker's
        ranks taking every core."""
        if not self.divide_cores or (self.workers <= 1 and self.hosts is None):
            return []
        # On test hosts, one share per worker host (a spare may join later).
        ways = max(1, self.workers, len(self.hosts.names) - 1 if self.hosts else 0)
        count = max(1, cores.usable_cpus() // ways)
        match = re.fullmatch(r"node-(\d+)", name)
        index = int(match.group(1)) if match else len(self.worker_processes)
        if not cores.can_pin():
            return ["--cpus", str(count)]
        share = cores.split(cores.cpu_list(), ways)[index % ways]
        return ["--cpus", str(min(count, len(share))), "--cpu-set", cores.format_cpu_set(share)]

    def start_worker(self, name: str, *extra_args: str) -> ManagedProcess:
        work_dir = self.state_dir / name
        worker = _spawn(
            name,
            [
                "-m",
                "worker",
                "--server",
                self.server_urls_for(len(self.worker_processes)),
                "--name",
                name,
                *self.worker_placement(name),
                "--slots",
                str(self.worker_slots),
                "--data-dir",
                str(self.data_dir.resolve()),
                "--work-dir",
                str(work_dir / "runs"),
                *self.worker_args,
                *extra_args,
            ],
            self.state_dir / f"{name}.log",
            {
                **self.extra_env,
                **(
                    {"DDPO_JOIN_TOKEN": self.tokens.join}
                    if self.tokens and not self.server_makes_tokens
                    else {}
                ),
            },
            self.state_dir,
            on=self._on(name),
        )
        self.worker_processes.append(worker)
        return worker

    def wait_for_nodes(self, count: int, timeout_s: float = 60.0) -> None:
        """``count`` live nodes heard from since this cluster started: in a
        state directory used before (``ddpo local-cluster``, then ``--keep``),
        the database still holds the last run's nodes as live until the new
        server judges them, and a job placed on one before its worker has
        registered again would fail when it does."""
        since = self._started_at

        def heard_since(node: NodePublic) -> bool:
            heard = node.last_heartbeat_at
            heard = heard if heard.tzinfo else heard.replace(tzinfo=timezone.utc)
            return since is None or heard >= since

        def enough() -> bool:
            answer = httpx.get(
                f"{self.url}/nodes?state=live&limit=1000", timeout=5, headers=self.headers("read")
            )
            live = NodesPublic.model_validate_json(answer.content).data
            return sum(1 for node in live if heard_since(node)) >= count

        self._wait(enough, timeout_s, f"{count} live node(s)", None)

    def _wait(
        self, ready: Callable[[], bool], timeout_s: float, what: str, process: ManagedProcess | None
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process is not None and process.process.poll() is not None:
                raise RuntimeError(
                    f"{process.name} exited with code {process.process.returncode} "
                    f"while waiting for {what}:\n{process.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if ready():
                    return
            time.sleep(0.1)
        raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")

    def stop(self) -> None:
        try:
            self._stop_processes()
        finally:
            if self._lock is not None:
                self._lock.close()  # releases the state directory
                self._lock = None

    def _stop_processes(self) -> None:
        # Workers first, so they stop their ranks and report while the server is up.
        for worker in self.worker_processes:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.worker_processes:
            worker.stop()
        for server in {id(s): s for s in (*self.replica_processes, self.server) if s}.values():
            server.stop()
