"""The arrows between packages point one way: what each may import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

HTTP = ("fastapi", "starlette", "uvicorn")
# What each package may not import: the arrows point down, from the server
# (api) to its database layer (db) to the public package users import
# (ddpo: the client, the wire types, the script helpers); the worker and the
# CLI stand beside the server and reach it over HTTP only.
FORBIDDEN = {
    "ddpo": ("api", "db", "worker", "cli"),
    "db": ("api", "worker", "cli"),
    "worker": ("api", "db", "cli"),
    "cli": ("api", "db"),
}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def modules(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def within(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == root or name.startswith(f"{root}.") for root in roots)


def module_level_imports(path: Path) -> set[str]:
    """What a module imports when it is imported (not inside a function)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_package_imports_upward(package: str) -> None:
    wrong = {
        f"{path.relative_to(REPO)}: {name}"
        for path in modules(package)
        for name in imports(path)
        if within(name, FORBIDDEN[package])
    }
    if package == "ddpo":
        # The script helpers, inside a worker's rank only, write the worker's
        # run files (worker/runfiles.py): a call made there, never an import
        # of the package.
        helpers = REPO / "ddpo" / "__init__.py"
        wrong -= {
            f"{helpers.relative_to(REPO)}: {name}"
            for name in imports(helpers) - module_level_imports(helpers)
            if within(name, ("worker",))
        }
    assert wrong == set()


def test_db_and_the_worker_import_nothing_from_the_server() -> None:
    """The issue's own words: db/ and worker/ import nothing from api/."""
    wrong = {
        f"{path.relative_to(REPO)}: {name}"
        for path in [*modules("db"), *modules("worker")]
        for name in imports(path)
        if within(name, ("api",))
    }
    assert wrong == set()


def test_importing_the_public_package_pulls_in_no_server_or_torch() -> None:
    """Scripts and clients import ddpo: it must stay light."""
    probe = (
        "import sys, ddpo, ddpo.schemas, ddpo.lifecycle, ddpo.failures; "
        "ddpo.Client; ddpo.AsyncClient; ddpo.JobFailed; "
        "heavy = {'torch', 'fastapi', 'starlette', 'sqlalchemy', 'sqlmodel', 'api', 'db', "
        "'worker', 'cli', 'uvicorn'}; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_the_core_and_the_value_modules_know_nothing_of_http() -> None:
    paths = [*modules("api/core"), *modules("ddpo/schemas"), *modules("db")]
    paths += [REPO / "ddpo" / f"{name}.py" for name in ("lifecycle", "failures")]
    paths += [REPO / "api" / "scheduling.py"]
    wrong = {
        f"{path.relative_to(REPO)}: {name}"
        for path in paths
        for name in imports(path)
        if within(name, HTTP)
    }
    assert wrong == set()


def test_http_errors_are_raised_only_at_the_http_edge() -> None:
    edge = {"api/main.py", "api/deps.py", "api/auth.py"}
    raising = {
        str(path.relative_to(REPO))
        for path in modules("api")
        if "HTTPException" in path.read_text()
    }
    assert {p for p in raising if p not in edge and not p.startswith("api/routes/")} == set()


def test_importing_the_core_pulls_in_no_web_framework() -> None:
    """Not even through a module it imports: the core runs without FastAPI."""
    probe = (
        "import sys, api.core.jobs, api.core.nodes, api.core.clock, api.core.reports, "
        "api.core.artifacts; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'fastapi', 'starlette'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_server_that_runs_no_sweep_loads_no_optuna() -> None:
    """Optuna brings numpy and its BLAS threads (17 MB): loaded with the
    first sweep's decision (api/core/sweeps.py), not with the server."""
    probe = (
        "import sys, api.main; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'optuna', 'numpy', 'scipy'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
