"""docker-compose.yml against the real entry points (no Docker engine runs
here): every command is a console script this package installs, its flags
parse, and every environment variable is one its settings read."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from api import __main__ as server_main
from api.settings import ServerSettings
from tests.conftest import REPO
from worker import __main__ as worker_main
from worker.settings import WorkerSettings

ENTRY_POINTS = {
    "ddpo-server": (server_main.build_parser, ServerSettings),
    "ddpo-worker": (worker_main.build_parser, WorkerSettings),
}


def environment_names(settings: type[BaseSettings]) -> set[str]:
    prefix = str(settings.model_config.get("env_prefix", ""))
    names = set()
    for name, field in settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names |= {c for c in alias.choices if isinstance(c, str) and c.isupper()}
        else:
            names.add(f"{prefix}{name}".upper())
    return names


def services() -> dict[str, Any]:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    found: dict[str, Any] = compose["services"]
    return found


def test_every_service_runs_an_installed_console_script() -> None:
    installed = {e.name: e.value for e in entry_points(group="console_scripts")}
    for name, service in services().items():
        entry = service["command"][0]
        assert entry in ENTRY_POINTS, f"{name}: {entry} is not ours"
        build_parser = ENTRY_POINTS[entry][0]
        assert installed.get(entry) == f"{build_parser.__module__}:main", entry


@pytest.mark.parametrize("name", sorted(services()))
def test_every_flag_and_variable_is_one_the_entry_point_reads(name: str) -> None:
    service = services()[name]
    build_parser, settings = ENTRY_POINTS[service["command"][0]]
    build_parser().parse_args(service["command"][1:])  # SystemExit on an unknown flag
    unknown = set(service.get("environment", {})) - environment_names(settings)
    assert not unknown, f"{name}: {sorted(unknown)} are read by nothing"


def test_workers_advertise_an_address_their_peers_reach() -> None:
    """Not loopback, and not a name only their own container resolves: the
    default (the route to the server) or a service name."""
    workers = {n: s for n, s in services().items() if s["command"][0] == "ddpo-worker"}
    assert len(workers) >= 2
    for name, service in workers.items():
        args = worker_main.build_parser().parse_args(service["command"][1:])
        assert args.address in (None, *services()), f"{name} advertises {args.address}"
        assert "127.0.0.1" not in (args.server_url or "")


def test_a_wrong_variable_would_be_caught() -> None:
    assert "DDPO_WORKER_ADRESS" not in environment_names(WorkerSettings)
    assert {"DDPO_DATA_DIR", "DDPO_JOIN_TOKEN", "DDPO_WORKER_CPUS"} <= environment_names(
        WorkerSettings
    )
    assert {"DATABASE_URL", "DDPO_ADMIN_TOKEN"} <= environment_names(ServerSettings)
