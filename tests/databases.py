"""The database a test's server uses: a SQLite file of its own, or, with
DDPO_TEST_POSTGRES_URL set (CI's PostgreSQL lane), a fresh database on that
PostgreSQL server, dropped when the test session ends."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from sqlalchemy.engine import make_url

# e.g. postgresql+psycopg://postgres@127.0.0.1:55432/postgres
POSTGRES_ENV = "DDPO_TEST_POSTGRES_URL"

_made: list[str] = []


def on_postgres() -> bool:
    return bool(os.environ.get(POSTGRES_ENV))


def _admin() -> str:
    """The server's URL as libpq takes it (no SQLAlchemy driver name)."""
    url = make_url(os.environ[POSTGRES_ENV]).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


def fresh_database_url(directory: Path, name: str = "ddpo") -> str:
    """A new, empty database for one test."""
    if not on_postgres():
        return f"sqlite:///{directory / f'{name}.db'}"
    import psycopg

    database = f"ddpo_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(_admin(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    _made.append(database)
    url = make_url(os.environ[POSTGRES_ENV]).set(database=database)
    return url.render_as_string(hide_password=False)


def drop_made() -> None:
    if not _made:
        return
    import psycopg

    with psycopg.connect(_admin(), autocommit=True) as admin:
        while _made:
            admin.execute(f'DROP DATABASE IF EXISTS "{_made.pop()}" WITH (FORCE)')
