"""What user code touches: the ``ddpo`` module scripts import (report,
checkpoints), a worker's script directory, and the environment each script
process gets."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import ddpo
from ddpo.schemas import Assignment, JobSpec, ScriptRef
from tests.conftest import REPO
from worker import runfiles, script_launch, scripts


@pytest.fixture(autouse=True)
def outside_ddpo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("RANK", ddpo.RUN_DIR_ENV, ddpo.CHECKPOINT_DIR_ENV, ddpo.RESUME_EPOCH_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ddpo, "_writer", None)
    monkeypatch.setattr(ddpo, "_steps", 0)
    yield
    if ddpo._writer is not None:
        ddpo._writer.close()


def test_importing_ddpo_and_reporting_loads_neither_torch_nor_the_server(tmp_path: Path) -> None:
    code = (
        "import sys, ddpo; ddpo.report(step=1, loss=0.5, acc=1); ddpo.save_checkpoint(epoch=1); "
        "print(sorted(m for m in ('torch', 'fastapi', 'sqlmodel') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), ddpo.RUN_DIR_ENV: str(tmp_path), "RANK": "0"}
    env[ddpo.CHECKPOINT_DIR_ENV] = str(tmp_path / "checkpoint")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert runfiles.latest_checkpoint(tmp_path) is not None


def test_outside_ddpo_report_prints_on_rank_0_and_does_nothing_elsewhere(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    ddpo.report(step=7, loss=0.25, accuracy=0.5)
    ddpo.report(loss=float("nan"))
    assert capsys.readouterr().out.splitlines() == [
        "[ddpo] step 7: loss=0.25 accuracy=0.5",
        "[ddpo] step 8: ",
    ]
    monkeypatch.setenv("RANK", "1")
    ddpo.report(step=9, loss=0.1)
    assert capsys.readouterr().out == ""
    ddpo.save_checkpoint(epoch=1)  # nothing to hand a checkpoint to: harmless
    assert ddpo.checkpoint_dir() == Path("checkpoint") and ddpo.resume_epoch() is None


def test_under_ddpo_rank_0s_reports_reach_the_progress_file_with_their_metrics(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ddpo.RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    ddpo.report(step=10, loss=0.5, accuracy=0.75, lr=0.1)
    ddpo.report(epoch=2, batch=3, batches_per_epoch=5, loss=float("inf"), bleu=12)
    first, second = runfiles.ProgressReader(tmp_path).read_new()
    assert (first.step, first.epoch, first.batch, first.loss) == (10, 1, 10, 0.5)
    assert first.metrics == {"accuracy": 0.75, "lr": 0.1}
    assert (second.step, second.epoch, second.batch, second.batches_per_epoch) == (11, 2, 3, 5)
    assert second.loss is None and second.metrics == {"bleu": 12.0}
    with pytest.raises(TypeError, match="accuracy must be a number"):
        ddpo.report(step=1, accuracy="high")


def test_save_checkpoint_hands_the_worker_the_directory_whole_and_keeps_only_the_newest(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ddpo.RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(ddpo.CHECKPOINT_DIR_ENV, str(tmp_path / "checkpoint"))
    (ddpo.checkpoint_dir() / "model.bin").write_bytes(b"epoch one")
    ddpo.save_checkpoint(epoch=1)
    (ddpo.checkpoint_dir() / "model.bin").write_bytes(b"epoch two")
    (ddpo.checkpoint_dir() / "sub").mkdir()
    (ddpo.checkpoint_dir() / "sub" / "opt.bin").write_bytes(b"state")
    ddpo.save_checkpoint(epoch=2)

    assert [(p.name, e) for p, e in runfiles.checkpoints(tmp_path)] == [
        ("checkpoint-epoch-2.pt", 2)
    ]
    restored = tmp_path / "restored"
    with tarfile.open(runfiles.checkpoint_path(tmp_path, 2)) as archive:
        archive.extractall(restored, filter="data")
    assert (restored / "model.bin").read_bytes() == b"epoch two"
    assert (restored / "sub" / "opt.bin").read_bytes() == b"state"


def test_a_script_directory_offers_the_scripts_a_job_can_name_and_nothing_outside(
    tmp_path: Path,
) -> None:
    root = tmp_path / "scripts"
    (root / "nlp").mkdir(parents=True)
    (root / ".hidden").mkdir()
    (root / "train.py").write_text("print('train')\n")
    (root / "nlp" / "lm.py").write_text("print('lm')\n")
    (root / ".hidden" / "secret.py").write_text("")
    (root / "has space.py").write_text("")
    (root / "notes.txt").write_text("")
    outside = tmp_path / "outside.py"
    outside.write_text("print('outside')\n")
    (root / "link.py").symlink_to(outside)

    offered = {s.path: s.sha256 for s in scripts.scan(root)}
    assert sorted(offered) == ["nlp/lm.py", "train.py"]
    assert offered["train.py"] == scripts.sha256_of(root / "train.py")

    assert scripts.locate(root, ScriptRef(path="nlp/lm.py")) == (root / "nlp" / "lm.py").resolve()
    with pytest.raises(scripts.ScriptUnavailable, match="is not in"):
        scripts.locate(root, ScriptRef(path="link.py"))
    with pytest.raises(scripts.ScriptUnavailable, match="changed since the job was submitted"):
        scripts.locate(root, ScriptRef(path="train.py", sha256="0" * 64))
    with pytest.raises(scripts.ScriptUnavailable, match="no script directory"):
        scripts.locate(None, ScriptRef(path="train.py"))
    assert scripts.scan(None) == []


def test_a_script_dir_that_is_not_there_is_said_with_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    assert scripts.scan(Path("scripts")) == []
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert str(tmp_path / "scripts") in warning and "relative to the worker's" in warning
    assert "offers no scripts" in warning


def test_each_script_process_gets_the_environment_torchrun_gives(tmp_path: Path) -> None:
    spec = JobSpec(
        script=ScriptRef(path="t.py"),
        topology={"num_machines": 2, "num_processes": 3},
        max_restarts=4,
    )
    assignment = Assignment(
        part_id=5,
        job_id=42,
        attempt_id=9,
        machine_id=1,
        spec=spec,
        master_addr="10.0.0.1",
        restart_count=2,
    )
    config = runfiles.LaunchConfig(
        assignment=assignment,
        run_dir=tmp_path,
        data_dir=tmp_path,
        process_group_timeout_s=30,
        parent_pid=os.getpid(),
        cpus=6,
    )
    assert script_launch.torchrun_env(config, local_rank=2, master_port=29400) == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
        "WORLD_SIZE": "6",
        "RANK": "5",
        "LOCAL_RANK": "2",
        "LOCAL_WORLD_SIZE": "3",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_NAME": "default",
        "ROLE_RANK": "5",
        "ROLE_WORLD_SIZE": "6",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "4",
        "TORCHELASTIC_RUN_ID": "ddpo-job-42",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "OMP_NUM_THREADS": "2",
    }


def two_rank_config(tmp_path: Path) -> runfiles.LaunchConfig:
    return runfiles.LaunchConfig(
        assignment=Assignment(
            part_id=1,
            job_id=1,
            attempt_id=1,
            machine_id=0,
            spec=JobSpec(script=ScriptRef(path="t.py"), topology={"num_processes": 2}),
            master_addr="127.0.0.1",
        ),
        run_dir=tmp_path,
        data_dir=tmp_path,
        process_group_timeout_s=30,
        parent_pid=os.getpid(),
    )


def supervised(tmp_path: Path, said: dict[int, str]) -> runfiles.Outcome:
    """How a part of two ranks running ``said`` (Python, one per rank) ends."""
    ranks = []
    for rank, code in said.items():
        with open(runfiles.rank_log(tmp_path, rank), "wb") as log:
            ranks.append(
                subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)
            )
    try:
        return script_launch._supervise(two_rank_config(tmp_path), ranks)
    finally:
        script_launch._stop(tmp_path, ranks)  # as run() does


LOST_A_PEER = "print('RuntimeError: [pair.cc:534] Connection closed by peer'); raise SystemExit(1)"


def raises_after(seconds: float) -> str:
    return f"import time; time.sleep({seconds}); raise ValueError('shard 1 has no labels')"


def test_a_rank_that_only_lost_its_peer_yields_to_the_peer_that_raised(tmp_path: Path) -> None:
    """The rank that raised closes its sockets before its process is gone:
    the one waiting on it may exit first. The part still names the cause."""
    outcome = supervised(
        tmp_path,
        {0: LOST_A_PEER, 1: raises_after(0.5)},
    )
    assert (outcome.reason, outcome.failing_rank, outcome.exit_code) == ("rank_failed", 1, 1)
    assert "ValueError: shard 1 has no labels" in (outcome.traceback_tail or "")


def test_a_raising_rank_slow_to_exit_on_a_busy_host_is_still_the_cause(tmp_path: Path) -> None:
    """On a busy host the rank that raised may take seconds to be gone
    after its peer gave up (issue 34 looked for this): the part waits for
    it rather than report the peer's symptom, which would be retried."""
    outcome = supervised(
        tmp_path,
        {0: LOST_A_PEER, 1: raises_after(4)},
    )
    assert (outcome.reason, outcome.failing_rank) == ("rank_failed", 1)


CRASHES_AFTER = (
    "import os, signal, sys, traceback\n"
    "try:\n"
    "    raise ValueError('shard 1 has no labels')\n"
    "except ValueError:\n"
    "    traceback.print_exc(); sys.stderr.flush()\n"
    "{then}"
    "os.kill(os.getpid(), signal.SIGSEGV)\n"
)


def test_a_rank_that_raised_and_crashed_on_its_way_out_failed_by_itself(tmp_path: Path) -> None:
    """A library's teardown may crash after the exception's traceback was
    printed (a segfault at exit): the exception is still the cause, and a
    retry would raise it again."""
    outcome = supervised(tmp_path, {0: LOST_A_PEER, 1: CRASHES_AFTER.format(then="")})
    assert (outcome.reason, outcome.failing_rank, outcome.exit_code) == ("rank_failed", 1, -11)
    assert outcome.message == "rank 1 (machine 0) raised, then was killed by SIGSEGV exiting"
    assert "ValueError: shard 1 has no labels" in (outcome.traceback_tail or "")


ABORTS_IN_TEARDOWN = (
    "import os, signal, sys\n"
    "sys.stderr.write('Traceback (most recent call last):\\n'\n"
    "    '  File \"raises.py\", line 17, in check_shard\\n'\n"
    "    'ValueError: shard 1 of 2 has no labels\\n'\n"
    "    'terminate called without an active exception\\n'); sys.stderr.flush()\n"
    "os.kill(os.getpid(), signal.SIGABRT)\n"
)


def test_a_rank_that_raised_and_aborted_in_a_librarys_teardown_failed_by_itself(
    tmp_path: Path,
) -> None:
    """What CI saw (1 run in 30 on a busy host): the rank raised while its
    peer waited in a barrier, and gloo's teardown then called
    std::terminate, which printed its line and aborted. Still the script's
    own exception: not retried."""
    outcome = supervised(tmp_path, {0: LOST_A_PEER, 1: ABORTS_IN_TEARDOWN})
    assert (outcome.reason, outcome.failing_rank, outcome.exit_code) == ("rank_failed", 1, -6)
    assert outcome.message == "rank 1 (machine 0) raised, then was killed by SIGABRT exiting"


def test_a_rank_killed_after_printing_a_handled_traceback_was_killed(tmp_path: Path) -> None:
    """A traceback the script caught and printed, then more output: the
    signal, not the exception, ended it (retried, as any kill is)."""
    outcome = supervised(
        tmp_path, {0: LOST_A_PEER, 1: CRASHES_AFTER.format(then="print('epoch 2: loss 0.3')\n")}
    )
    assert (outcome.reason, outcome.exit_code) == ("rank_exited", -11)
