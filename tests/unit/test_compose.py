"""docker-compose.yml against the real entry points (no Docker engine runs
here): every command of ours is a console script this package installs, its
flags parse, and every environment variable is one its settings read; the
API servers share one PostgreSQL database and one checkpoint volume, sit
behind one address that sends to each of them, and the workers speak to
them; the image holds every package this project installs."""

from __future__ import annotations

import re
from importlib.metadata import entry_points
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings
from sqlalchemy.engine import make_url

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


def compose() -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return found


def services() -> dict[str, Any]:
    found: dict[str, Any] = compose()["services"]
    return found


def ours() -> dict[str, Any]:
    """The services built from this repository (the others are images)."""
    return {name: s for name, s in services().items() if "build" in s}


def of(entry: str) -> dict[str, Any]:
    return {name: s for name, s in ours().items() if s["command"][0] == entry}


def test_every_service_runs_an_installed_console_script_or_a_pinned_image() -> None:
    installed = {e.name: e.value for e in entry_points(group="console_scripts")}
    for name, service in services().items():
        if "build" not in service:
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", service["image"]), f"{name}: pin its image"
            continue
        entry = service["command"][0]
        assert entry in ENTRY_POINTS, f"{name}: {entry} is not ours"
        build_parser = ENTRY_POINTS[entry][0]
        assert installed.get(entry) == f"{build_parser.__module__}:main", entry


@pytest.mark.parametrize("name", sorted(ours()))
def test_every_flag_and_variable_is_one_the_entry_point_reads(name: str) -> None:
    service = ours()[name]
    build_parser, settings = ENTRY_POINTS[service["command"][0]]
    build_parser().parse_args(service["command"][1:])  # SystemExit on an unknown flag
    unknown = set(service.get("environment", {})) - environment_names(settings)
    assert not unknown, f"{name}: {sorted(unknown)} are read by nothing"


def test_workers_advertise_an_address_their_peers_reach() -> None:
    """Not loopback, and not a name only their own container resolves: the
    default (the route to the server) or a service name."""
    workers = of("ddpo-worker")
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


def test_the_api_servers_share_one_postgresql_database_and_the_checkpoints() -> None:
    servers = of("ddpo-server")
    assert len(servers) >= 2
    urls = {s["environment"]["DATABASE_URL"] for s in servers.values()}
    assert len(urls) == 1
    url = make_url(urls.pop().replace("${", "").replace("}", ""))  # compose's variables aside
    assert url.drivername == "postgresql+psycopg"
    assert url.host in services() and "postgres" in services()[url.host]["image"]
    artifacts = {s["environment"]["DDPO_ARTIFACTS_DIR"] for s in servers.values()}
    assert len(artifacts) == 1
    mounted = {
        tuple(v for v in s["volumes"] if v.endswith(":" + next(iter(artifacts))))
        for s in servers.values()
    }
    assert len(mounted) == 1 and len(next(iter(mounted))) == 1, "one shared volume"


def test_one_published_address_sends_to_every_api_server() -> None:
    published = {n: s for n, s in services().items() if s.get("ports")}
    assert list(published) == ["api"], "only the proxy is published"
    proxy = published["api"]
    assert all(p.startswith("127.0.0.1:") for p in proxy["ports"]), "loopback only"
    (config,) = proxy["configs"]
    text = compose()["configs"][config["source"]]["content"]
    upstream = set(re.findall(r"^\s*server\s+([\w-]+):8000", text, re.M))
    assert upstream == set(of("ddpo-server"))
    assert re.search(r"proxy_read_timeout\s+(\d+)s", text), "long-polls outlast the default"
    assert "$$host" in text, "compose would read $host as its own variable"


def test_every_worker_speaks_to_api_servers_each_first_to_a_different_one() -> None:
    servers = set(of("ddpo-server"))
    firsts = []
    for name, service in of("ddpo-worker").items():
        args = worker_main.build_parser().parse_args(service["command"][1:])
        named = [re.fullmatch(r"http://([\w-]+):8000", u) for u in args.server_url.split(",")]
        assert all(named), f"{name}: {args.server_url}"
        assert {m.group(1) for m in named if m} == servers, name
        firsts.append(named[0].group(1) if named[0] else None)
    assert len(set(firsts)) == len(servers), "the workers split between the servers"


def test_the_image_holds_every_package_this_project_installs() -> None:
    project = (REPO / "pyproject.toml").read_text()
    found = re.search(r"^\[tool.setuptools.packages.find\]\ninclude = \[(.*)\]$", project, re.M)
    assert found, "pyproject.toml names its packages"
    packages = re.findall(r'"([^"]+)"', found.group(1))
    dockerfile = (REPO / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \1$", dockerfile, re.M))
    assert {p.rstrip("*") for p in packages} <= copied
