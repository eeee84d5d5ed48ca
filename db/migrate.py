"""The schema's version: a new database gets every revision; a server
refuses one whose schema is behind (``ddpo-server db upgrade`` brings it up
to date, keeping every row); a database made before migrations existed has
the base revision's schema (db/migrations/versions/0001_base.py)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect

MIGRATIONS = Path(__file__).parent / "migrations"
BASE = "0001"
UPGRADE_COMMAND = "ddpo-server db upgrade"


class SchemaMismatch(RuntimeError):
    """The database's schema is not the one this server reads and writes."""


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head() -> str:
    revision = ScriptDirectory.from_config(_config()).get_current_head()
    assert revision is not None
    return revision


def current(engine: Engine) -> str | None:
    """The database's revision; None for an empty database. One with tables
    but no revision was made before migrations: the base's."""
    with engine.connect() as connection:
        revision = MigrationContext.configure(connection).get_current_revision()
        if revision is None and inspect(connection).has_table("job"):
            return BASE
        return revision


def upgrade(engine: Engine, to: str = "head") -> tuple[str | None, str]:
    """Bring the schema to this release's (or to revision ``to``): the
    revision it was at, and the one it is at now."""
    was = current(engine)
    with engine.begin() as connection:
        config = _config()
        config.attributes["connection"] = connection
        if was == BASE and MigrationContext.configure(connection).get_current_revision() is None:
            command.stamp(config, BASE)  # made before migrations: it has the base schema
        command.upgrade(config, to)
    return was, head() if to == "head" else to


def prepare(engine: Engine) -> None:
    """An empty database gets the whole schema; one at this release's
    revision is used as it is; any other is refused, with what to do."""
    revision = current(engine)
    if revision is None:
        upgrade(engine)
        return
    wanted = head()
    if revision == wanted:
        return
    known = {script.revision for script in ScriptDirectory.from_config(_config()).walk_revisions()}
    if revision not in known:
        raise SchemaMismatch(
            f"the database's schema is at revision {revision}, which this release of ddpo "
            f"does not know (it needs {wanted}): a newer ddpo-server made it; run that one"
        )
    raise SchemaMismatch(
        f"the database's schema is at revision {revision} and this release needs {wanted}: "
        f"back the database up, then run `{UPGRADE_COMMAND}` (with the same DATABASE_URL); "
        "every job, attempt, log line, checkpoint record and node credential is kept"
    )
