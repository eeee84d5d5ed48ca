"""Alembic's environment: run by db/migrate.py with the connection to use,
or by Alembic's own command line (``alembic -c db/alembic.ini upgrade head``
with DATABASE_URL set)."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine
from sqlmodel import SQLModel

from db import models  # noqa: F401  (registers the tables on SQLModel.metadata)

config = context.config
connection = config.attributes.get("connection")


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=SQLModel.metadata,
        # SQLite alters a table by copying it: Alembic's batch mode does that.
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if connection is not None:
    _run(connection)
else:
    url = os.environ.get("DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("set DATABASE_URL to the database to migrate")
    engine = create_engine(url)
    with engine.begin() as opened:
        _run(opened)
    engine.dispose()
