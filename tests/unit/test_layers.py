"""The arrows between packages point one way: what each may import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# api's pure value modules: no HTTP, no database, no decisions; and the
# files a server leaves for clients on its host (a format that the CLI and
# workers read).
VALUES = ("api.lifecycle", "api.failures", "api.schemas", "api.local_tokens")
HTTP = ("fastapi", "starlette", "uvicorn")


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


@pytest.mark.parametrize("package", ["db", "worker"])
def test_db_and_the_worker_import_only_apis_value_modules(package: str) -> None:
    wrong = {
        f"{path.relative_to(REPO)}: {name}"
        for path in modules(package)
        for name in imports(path)
        if within(name, ("api",)) and name != "api" and not within(name, VALUES)
    }
    assert wrong == set()


def test_the_core_and_the_value_modules_know_nothing_of_http() -> None:
    paths = [*modules("api/core"), *modules("api/schemas"), *modules("db")]
    paths += [REPO / "api" / f"{name}.py" for name in ("lifecycle", "failures", "scheduling")]
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
