"""What of the daemon's environment reaches a rank (worker/rank_env.py),
and where the node's credential is kept."""

from __future__ import annotations

from pathlib import Path

from worker import credentials, rank_env
from worker.settings import WorkerSettings

DAEMON = {
    "PATH": "/usr/bin",
    "PYTHONPATH": "/opt/trainers",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "NCCL_DEBUG": "INFO",
    "OMP_NUM_THREADS": "4",
    "LC_ALL": "C.UTF-8",
    "DDPO_JOIN_TOKEN": "ddpo-join-secret",
    "DDPO_SERVER": "http://10.0.0.1:8000",
    "DDPO_RUN_DIR": "/elsewhere",
    "AWS_SECRET_ACCESS_KEY": "s3-secret",
    "WANDB_API_KEY": "w",
    "MY_SITE_PROXY": "p",
}


def test_a_rank_gets_the_allow_list_and_no_ddpo_variable() -> None:
    allowed = ["PATH", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "OMP_NUM_THREADS"]
    allowed.append("LC_ALL")
    assert rank_env.for_ranks(DAEMON) == {name: DAEMON[name] for name in allowed}


def test_the_worker_adds_names_and_prefixes_but_never_its_own() -> None:
    got = rank_env.for_ranks(DAEMON, ["WANDB_API_KEY", "MY_SITE_*", "DDPO_*", "DDPO_JOIN_TOKEN"])
    assert got["WANDB_API_KEY"] == "w"
    assert got["MY_SITE_PROXY"] == "p"
    assert not [name for name in got if name.startswith("DDPO_")]
    assert "AWS_SECRET_ACCESS_KEY" not in got


def test_the_setting_is_a_comma_separated_list() -> None:
    settings = WorkerSettings(name="n", rank_env=" WANDB_API_KEY, HF_* ,")
    assert settings.rank_env_names == ["WANDB_API_KEY", "HF_*"]


def test_the_credential_lives_beside_the_work_directory_and_moves_there(tmp_path: Path) -> None:
    settings = WorkerSettings(name="n", work_dir=tmp_path / "runs")
    assert settings.credential_path == tmp_path / "runs.node-credential"
    # Not inside the tree the ranks' working directories are in.
    assert tmp_path / "runs" not in settings.credential_path.parents
    legacy = settings.legacy_credential_path
    credentials.save(legacy, "ddpo-node-old")
    credentials.move_from(legacy, settings.credential_path)
    assert credentials.load(settings.credential_path) == "ddpo-node-old"
    assert not legacy.exists()
    # A credential already in the new place is never overwritten by an old one.
    credentials.save(legacy, "ddpo-node-older")
    credentials.move_from(legacy, settings.credential_path)
    assert credentials.load(settings.credential_path) == "ddpo-node-old"
