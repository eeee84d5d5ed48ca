"""A fork server for launchers: one process per node imports torch and the
trainers once (and loads the data they all read), then forks a launcher for
each part in a few milliseconds.

Importing torch takes about 3 s of CPU here. A launcher started fresh for each
part pays it at the start of every job; one started ahead of time pays it
between jobs, which delays the next job when jobs come back to back (a scaling
study's rows, a script's queue). Forking from a process that already has the
imports pays it once, when the worker starts.

The protocol, one line each way per event:
    daemon -> server   <run_dir>            fork a launcher for this part
    server -> daemon   offers <json>        the trainers it loaded (worker.trainers.describe)
    server -> daemon   ready                imports done, forks are cheap now
    server -> daemon   forked <pid>         the launcher for the last request
    server -> daemon   exited <pid> <code>  a launcher ended (code < 0: signal)

Each launcher starts its own session (so the daemon can signal it and its
ranks as one group), dies with the server, and the server with the daemon.
This module imports torch only in the server process, never in the daemon.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path

from worker import shield
from worker._process import die_with_parent, pid_exists, signal_group

# How long the daemon waits for "forked <pid>" once the server is ready.
FORK_REPLY_TIMEOUT_S = 10.0


# --- the server ----------------------------------------------------------------


def serve(data_dir: Path, extra_trainers: dict[str, str]) -> int:
    """``python -m worker.forkserver DATA_DIR [TRAINERS_JSON]``: the daemon's
    child, on pipes."""
    daemon = os.getppid()
    die_with_parent(daemon, signal.SIGTERM)
    # The daemon stops it with EOF; a SIGTERM to every process is not for it.
    shield.install(daemon)
    from worker import launcher, trainers

    offers = launcher.preload(data_dir, extra_trainers)
    _say(f"offers {trainers.offers_json(offers)}")
    wake_read, wake_write = os.pipe()
    for fd in (wake_read, wake_write):
        os.set_blocking(fd, False)
    # SIGCHLD writes to the pipe, so one select() watches requests and exits.
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _say("ready")
    pending = b""
    while True:
        readable, _, _ = select.select([sys.stdin.fileno(), wake_read], [], [])
        if wake_read in readable:
            while _drain(wake_read):
                pass
            _reap()
        if sys.stdin.fileno() in readable:
            data = os.read(sys.stdin.fileno(), 4096)
            if not data:
                return 0  # the daemon is gone or done with us
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = _fork_launcher(Path(line.decode()), (wake_read, wake_write))
                _say(f"forked {pid}")


def _say(line: str) -> None:
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _say(f"exited {pid} {os.waitstatus_to_exitcode(status)}")


def _fork_launcher(run_dir: Path, server_fds: tuple[int, int]) -> int:
    server_pid = os.getpid()
    # The child says when it leads its own session: only then can the daemon
    # reach it with one signal to its group, so only then is its pid sent.
    in_session_read, in_session_write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(in_session_write)
        os.read(in_session_read, 1)  # a byte, or EOF if the child died first
        os.close(in_session_read)
        return pid
    code = 1
    try:
        os.close(in_session_read)
        os.setsid()
        os.write(in_session_write, b"s")
        os.close(in_session_write)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in server_fds:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, sys.stdin.fileno())
        os.close(devnull)
        from worker import launcher

        code = launcher.run_attached(run_dir, parent_pid=server_pid)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# --- the daemon's side ---------------------------------------------------------


class ForkedLauncher:
    """What the daemon holds for a forked launcher: the parts of
    ``subprocess.Popen`` it uses (pid, poll, returncode)."""

    def __init__(self, pid: int, server: ForkServer) -> None:
        self.pid = pid
        self.server = server
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode


class ForkServer:
    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        extra_trainers: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "worker.forkserver",
                    str(data_dir),
                    json.dumps(extra_trainers or {}),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                # The launchers it forks, and their ranks, inherit this.
                env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
            )
        assert self.process.stdout is not None
        self._out = self.process.stdout.fileno()
        os.set_blocking(self._out, False)
        self._pending = b""
        self._ready = False
        # The "offers" line, as JSON: what the server's trainers are.
        self.offers: str | None = None
        self._eof = False
        self._forked: deque[int] = deque()
        self._exits: dict[int, int] = {}

    def ready(self) -> bool:
        """Imports done and still running: a fork costs milliseconds."""
        self._read()
        return self._ready and not self._eof

    def wait_ready(self, timeout_s: float, give_up: Callable[[], bool] = lambda: False) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.ready() and not self._eof and not give_up():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            select.select([self._out], [], [], min(left, 0.5))
        return self.ready()

    def launch(self, run_dir: Path) -> ForkedLauncher:
        """Fork a launcher for ``run_dir``. OSError if the server cannot."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{run_dir}\n".encode())
        self.process.stdin.flush()
        deadline = time.monotonic() + FORK_REPLY_TIMEOUT_S
        while not self._forked:
            if self._eof:
                raise OSError("the launcher fork server exited")
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError("the launcher fork server did not answer")
            select.select([self._out], [], [], left)
            self._read()
        return ForkedLauncher(self._forked.popleft(), self)

    def exit_code(self, pid: int) -> int | None:
        self._read()
        if pid in self._exits:
            return self._exits.pop(pid)
        if self._eof and not pid_exists(pid):
            # The server died first: the kernel sent the launcher SIGTERM
            # (die_with_parent) and init reaped it; its code is lost with it.
            return -signal.SIGTERM
        return None

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """EOF tells it to exit; SIGKILL if it does not."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def _read(self) -> None:
        while not self._eof:
            try:
                data = os.read(self._out, 4096)
            except BlockingIOError:
                return
            if not data:
                self._eof = True
                return
            self._pending += data
            while b"\n" in self._pending:
                line, self._pending = self._pending.split(b"\n", 1)
                if line.startswith(b"offers "):
                    self.offers = line[len(b"offers ") :].decode()
                else:
                    self._handle(line.decode().split())

    def _handle(self, words: list[str]) -> None:
        if words == ["ready"]:
            self._ready = True
        elif len(words) == 2 and words[0] == "forked":
            self._forked.append(int(words[1]))
        elif len(words) == 3 and words[0] == "exited":
            self._exits[int(words[1])] = int(words[2])


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1]), json.loads(sys.argv[2]) if sys.argv[2:] else {}))
