"""Engine and sessions. ``DATABASE_URL`` alone decides SQLite or PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, text
from sqlalchemy.engine import make_url
from sqlmodel import Session, create_engine

from db import migrate, models  # noqa: F401  (models registers the tables)

# A writer waits this long for SQLite's single write lock before giving up.
SQLITE_BUSY_TIMEOUT_MS = 30_000
# PostgreSQL: the advisory lock every write transaction takes first, the
# same one for every server on the database (see Database.write).
WRITE_LOCK_KEY = 0x6464706F  # "ddpo"


class Database:
    """The engine plus the two kinds of session the server uses.

    ``read()`` sessions see a consistent snapshot and never block writers
    (WAL). ``write()`` sessions take the write lock up front (SQLite's
    ``BEGIN IMMEDIATE``), so a read-then-write transaction such as a gang
    claim can never be overtaken between its read and its write.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        # Committed write transactions that changed each table: a cached
        # read of some tables taken before their counts moved may be stale
        # (see api/read_cache.py).
        self._writes: dict[type, int] = {}
        self._writes_lock = threading.Lock()
        self._after_commit: list[Callable[[Sequence[object]], None]] = []
        self.is_sqlite = make_url(url).get_backend_name() == "sqlite"
        self.engine = _make_engine(url, self.is_sqlite)
        self._write_engine = self.engine.execution_options(ddpo_begin="IMMEDIATE")
        # PostgreSQL: a read session sees one snapshot, as SQLite's WAL gives.
        self._read_engine = (
            self.engine
            if self.is_sqlite
            else self.engine.execution_options(isolation_level="REPEATABLE READ")
        )

    def prepare_schema(self) -> None:
        """The whole schema for an empty database; SchemaMismatch for one
        this release cannot use (db/migrate.py)."""
        migrate.prepare(self.engine)

    def after_commit(self, callback: Callable[[Sequence[object]], None]) -> None:
        """Call ``callback`` with the rows a write transaction added, changed
        or deleted, as they stand once it has committed (from the thread that
        committed it)."""
        self._after_commit.append(callback)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self._read_engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A transaction that commits on success and rolls back on error."""
        with Session(self._write_engine, expire_on_commit=False) as session:
            rows: list[object] = []

            def note(changed: Session, *_: object) -> None:
                rows.extend((*changed.new, *changed.deleted))
                rows.extend(row for row in changed.dirty if changed.is_modified(row))

            event.listen(session, "before_flush", note)
            with session.begin():
                if not self.is_sqlite:
                    # One writer at a time, across every server on the
                    # database, as SQLite's BEGIN IMMEDIATE: a claim's read
                    # and its write cannot be overtaken between them.
                    session.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": WRITE_LOCK_KEY}
                    )
                yield session
        with self._writes_lock:
            for table in {type(row) for row in rows}:
                self._writes[table] = self._writes.get(table, 0) + 1
        if rows:
            for callback in self._after_commit:
                callback(rows)

    def writes_to(self, tables: tuple[type, ...]) -> tuple[int, ...]:
        """How many committed transactions have changed each of these tables."""
        return tuple(self._writes.get(table, 0) for table in tables)

    def dispose(self) -> None:
        self.engine.dispose()


def _make_engine(url: str, is_sqlite: bool) -> Engine:
    if not is_sqlite:
        return create_engine(url, pool_pre_ping=True)

    database = make_url(url).database
    if database and database != ":memory:":
        Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite's own
        # implicit BEGIN is deferred and comes too late for a claim).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = connection.get_execution_options().get("ddpo_begin", "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")

    return engine
