"""The worker's settings: defaults that keep several nodes on one host apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.__main__ import parse_settings


def test_workers_started_in_one_directory_get_run_directories_of_their_names() -> None:
    a = parse_settings(["--name", "node-a"])
    b = parse_settings(["--name", "node-b"])
    assert a.work_dir == Path("runs/node-a") and b.work_dir == Path("runs/node-b")
    assert a.credential_path != b.credential_path


def test_a_work_dir_given_is_kept() -> None:
    given = parse_settings(["--name", "node-a", "--work-dir", "/tmp/elsewhere"])
    assert given.work_dir == Path("/tmp/elsewhere")


def test_address_interface_and_cpus_come_from_flags() -> None:
    settings = parse_settings(["--address", "10.0.0.2", "--interface", "eth1", "--cpus", "3"])
    assert (settings.address, settings.interface, settings.cpus) == ("10.0.0.2", "eth1", 3)
    assert parse_settings([]).address is None  # the route to the server decides


def test_the_script_directory_comes_from_the_flag_or_ddpo_script_dir(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parse_settings([]).script_dir is None  # no scripts unless the operator says so
    monkeypatch.setenv("DDPO_SCRIPT_DIR", "/srv/scripts")
    assert parse_settings([]).script_dir == Path("/srv/scripts")
    assert parse_settings(["--script-dir", "/opt/jobs"]).script_dir == Path("/opt/jobs")
