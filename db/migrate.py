"""The schema's version: a new database gets the whole schema, stamped with
this release's revision; a server refuses one whose schema is behind
(``ddpo-server db upgrade`` brings it up to date, keeping every row); a
database made before migrations existed has the base revision's schema
(db/migrations/versions/0001_base.py).

Serving never imports Alembic (tests/e2e/test_memory.py saw a server that
had imported it keep 20 MB after a burst of large answers): the revision is
read with plain SQL, and only an upgrade loads Alembic.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    inspect,
    text,
)
from sqlalchemy import select as sa_select
from sqlmodel import SQLModel

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"
BASE = "0001"
# This release's revision: the newest in migrations/versions (a test checks).
HEAD = "0007"
UPGRADE_COMMAND = "ddpo-server db upgrade"
# PostgreSQL: the advisory lock held while a schema is looked at or made.
SCHEMA_LOCK_KEY = 0x6464706D  # "ddpm"

# Alembic's own table, as Alembic makes it.
_version = Table(
    "alembic_version",
    MetaData(),
    Column("version_num", String(32), nullable=False),
    PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)


class SchemaMismatch(RuntimeError):
    """The database's schema is not the one this server reads and writes."""


def _config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head() -> str:
    """The newest revision, as Alembic reads the migrations."""
    from alembic.script import ScriptDirectory

    revision = ScriptDirectory.from_config(_config()).get_current_head()
    assert revision is not None
    return revision


def current(engine: Engine) -> str | None:
    """The database's revision; None for an empty database. One with tables
    but no revision was made before migrations: the base's."""
    with engine.connect() as connection:
        return _revision(connection)


def _revision(connection: Connection) -> str | None:
    tables = inspect(connection)
    if tables.has_table(_version.name):
        revision = connection.execute(sa_select(_version.c.version_num)).scalar()
        if revision is not None:
            return str(revision)
    return BASE if tables.has_table("job") else None


def _one_at_a_time(connection: Connection) -> None:
    """PostgreSQL: servers (and upgrades) starting together on one database
    take turns to look at and make its schema, until their transaction ends."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})


def upgrade(engine: Engine, to: str = "head") -> tuple[str | None, str]:
    """Bring the schema to this release's (or to revision ``to``) with
    Alembic: the revision it was at, and the one it is at now."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    with engine.begin() as connection:
        _one_at_a_time(connection)
        was = _revision(connection)
        config = _config()
        config.attributes["connection"] = connection
        if was == BASE and MigrationContext.configure(connection).get_current_revision() is None:
            command.stamp(config, BASE)  # made before migrations: it has the base schema
        command.upgrade(config, to)
    return was, head() if to == "head" else to


def prepare(engine: Engine) -> None:
    """An empty database gets the whole schema (the tables as the models
    say, which a test holds equal to what the migrations make, stamped with
    this release's revision); one at this release's revision is used as it
    is; any other is refused, with what to do."""
    with engine.begin() as connection:
        _one_at_a_time(connection)
        revision = _revision(connection)
        if revision is None:
            SQLModel.metadata.create_all(connection)
            _version.create(connection)
            connection.execute(_version.insert().values(version_num=HEAD))
            return
    if revision == HEAD:
        return
    if revision not in _known():
        raise SchemaMismatch(
            f"the database's schema is at revision {revision}, which this release of ddpo "
            f"does not know (it needs {HEAD}): a newer ddpo-server made it; run that one"
        )
    raise SchemaMismatch(
        f"the database's schema is at revision {revision} and this release needs {HEAD}: "
        f"back the database up, then run `{UPGRADE_COMMAND}` (with the same DATABASE_URL); "
        "every job, attempt, log line, checkpoint record and node credential is kept"
    )


def _known() -> set[str]:
    from alembic.script import ScriptDirectory

    return {s.revision for s in ScriptDirectory.from_config(_config()).walk_revisions()}
