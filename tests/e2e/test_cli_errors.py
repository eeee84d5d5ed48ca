"""Every ``ddpo`` command when things go wrong, as a user meets it: no server,
no token, a wrong token, a reader's token on a write, a conflict, and a
server restarted while ``submit --wait`` follows a job. One line that says
what to do, a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.cluster import LocalCluster, free_port
from tests.conftest import REPO
from tests.e2e.conftest import Jobs, until

pytestmark = pytest.mark.e2e

# Every command that talks to a server, with arguments that are fine.
READS = [["list"], ["show", "1"], ["logs", "1"], ["logs", "1", "--follow"], ["nodes"]]
WRITES = [
    ["submit", "--max-steps-per-epoch", "1"],
    ["submit", "--wait", "--max-steps-per-epoch", "1"],
    ["cancel", "1"],
    ["study", "--rows", "1:128", "--max-steps-per-epoch", "1"],
]


def ddpo(
    *args: str, env: dict[str, str], timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("DDPO_SERVER", "DDPO_TOKEN")}
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=REPO,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def assert_one_clear_line(done: subprocess.CompletedProcess[str], *says: str) -> None:
    shown = done.stdout + done.stderr
    assert done.returncode != 0, shown
    assert "Traceback" not in shown, shown
    last = done.stderr.strip().splitlines()[-1]
    for words in says:
        assert words in last, last


@pytest.mark.parametrize("command", READS + WRITES, ids=" ".join)
def test_no_server_says_which_address_it_tried(command: list[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = ddpo(*command, env={"DDPO_SERVER": url})
    assert_one_clear_line(done, f"cannot reach the server at {url}", "DDPO_SERVER")


def test_a_server_without_a_scheme_is_taken_as_http_and_goes_before_the_command(
    cluster: LocalCluster,
) -> None:
    address = cluster.url.removeprefix("http://")
    token = {"DDPO_TOKEN": cluster.headers()["Authorization"].split()[1]}
    for argv in (["--server", address, "nodes"], ["nodes", "--server", address]):
        done = ddpo(*argv, env=token)
        assert done.returncode == 0, done.stderr
        assert "live" in done.stdout


@pytest.mark.parametrize("command", READS + WRITES, ids=" ".join)
def test_no_token_and_a_wrong_token_say_which_variable_to_set(
    cluster: LocalCluster, command: list[str]
) -> None:
    none = ddpo(*command, env={"DDPO_SERVER": cluster.url})
    assert_one_clear_line(none, "set DDPO_TOKEN", "DDPO_USER_TOKEN")
    wrong = ddpo(*command, env={"DDPO_SERVER": cluster.url, "DDPO_TOKEN": "not-a-token"})
    assert_one_clear_line(wrong, "DDPO_TOKEN is not a token this server accepts")


@pytest.mark.parametrize("command", WRITES, ids=" ".join)
def test_a_readers_token_on_a_write_says_which_role_is_needed(
    cluster: LocalCluster, command: list[str]
) -> None:
    done = ddpo(*command, env=cluster.cli_env() | {"DDPO_TOKEN": cluster.tokens.read})  # type: ignore[union-attr]
    assert_one_clear_line(
        done, "the reader role may not do this", "a key or token whose role may in DDPO_TOKEN"
    )


def test_conflicts_show_the_servers_reason(cluster: LocalCluster, jobs: Jobs) -> None:
    env = cluster.cli_env()
    first = ddpo("submit", "--idempotency-key", "cli-409", "--max-steps-per-epoch", "1", env=env)
    assert first.returncode == 0, first.stderr
    other = ddpo("submit", "--idempotency-key", "cli-409", "--epochs", "2", env=env)
    assert_one_clear_line(other, "Idempotency-Key 'cli-409' was used for job", "different spec")
    job_id = int(first.stdout.split()[2])
    same = ddpo("submit", "--idempotency-key", "cli-409", "--max-steps-per-epoch", "1", env=env)
    assert same.returncode == 0, same.stderr
    assert f"job {job_id} has this Idempotency-Key already" in same.stdout
    jobs.wait_done(job_id)
    again = ddpo("cancel", str(job_id), env=env)
    assert_one_clear_line(again, f"job {job_id} is already")
    missing = ddpo("show", "999999", env=env)
    assert_one_clear_line(missing, "job 999999 not found")


@pytest.fixture
def own_server(mnist_dir: Path, tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster whose server this test kills."""
    with LocalCluster(state_dir=tmp_path, data_dir=mnist_dir, workers=1) as running:
        yield running


def test_submit_wait_rides_out_a_server_restart_and_ends_with_the_result(
    own_server: LocalCluster,
) -> None:
    env = {**os.environ, **own_server.cli_env()}
    with subprocess.Popen(
        [sys.executable, "-m", "cli", "submit", "--wait", "--max-steps-per-epoch", "150"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as waiting:
        try:
            with own_server.client() as client:
                jobs = Jobs(client)
                until(lambda: client.get("/jobs").json()["count"] == 1, 30, "the job")
                jobs.wait(1, lambda j: j["progress"] is not None, 120, "training")
            assert own_server.server is not None
            own_server.server.process.send_signal(signal.SIGKILL)
            own_server.server.stop()
            down_at = time.monotonic()
            until(lambda: time.monotonic() - down_at > 3, 5, "the CLI to miss the server")
            own_server.start_server()  # same port, same database
            shown, _ = waiting.communicate(timeout=180)
        finally:
            waiting.kill()
    assert waiting.returncode == 0, shown
    assert "Traceback" not in shown, shown
    assert f"cannot reach the server at {own_server.url}" in shown
    assert "retrying until it answers" in shown and "the server is back" in shown
    assert "job 1 succeeded" in shown and "test accuracy" in shown
