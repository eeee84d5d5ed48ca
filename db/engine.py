"""Engine and sessions. ``DATABASE_URL`` alone decides SQLite or PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, bindparam, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import ORMExecuteState
from sqlmodel import Session, create_engine

from db import migrate, models
from db.changes import (
    CHANNEL,
    EVERYONE,
    LEASE_SILENCE_S,
    Change,
    Listener,
    SweepLease,
    Wake,
    new_origin,
)

T = TypeVar("T")
# Where a session keeps its database and, in a write, the rows it wrote.
_DATABASE = "ddpo.database"
_WRITTEN = "ddpo.written"
_STATEMENTS_WRITTEN = "ddpo.statements_written"
_CHANGES_SEEN = "ddpo.changes_seen"
# False for a write beside the writer (Database.write(exclusive=False)).
_EXCLUSIVE = "ddpo.exclusive"
# A writer waits this long for SQLite's single write lock before giving up.
SQLITE_BUSY_TIMEOUT_MS = 30_000
# PostgreSQL: the advisory lock every write transaction takes first, the
# same one for every server on the database (see Database.write).
WRITE_LOCK_KEY = 0x6464706F  # "ddpo"


# PostgreSQL's SQLSTATE for a lock not taken within lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"


class RowsBusy(Exception):
    """A write given ``row_wait_s`` (Database.write) found a row held by
    another transaction for longer, and wrote nothing."""


class WriteLockTimes:
    """How long this server's exclusive writes waited for the write lock
    (this server's writers queue first, then, on PostgreSQL, for the lock
    every server shares) and held it, summed: with several servers on one
    database, their held times over the wall time say how busy the one
    writer is (BENCHMARKS.md, placements at 5,000 nodes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._transactions = 0
        self._waited_s = 0.0
        self._held_s = 0.0

    def add(self, waited_s: float, held_s: float) -> None:
        with self._lock:
            self._transactions += 1
            self._waited_s += waited_s
            self._held_s += held_s

    def totals(self) -> tuple[int, float, float]:
        """Transactions, seconds waited, seconds held, read together."""
        with self._lock:
            return self._transactions, self._waited_s, self._held_s


class Database:
    """The engine plus the two kinds of session the server uses.

    ``read()`` sessions see a consistent snapshot and never block writers
    (WAL). ``write()`` sessions take the write lock up front (SQLite's
    ``BEGIN IMMEDIATE``), so a read-then-write transaction such as a gang
    claim can never be overtaken between its read and its write.
    """

    def __init__(
        self, url: str, wakes: Callable[[Sequence[object]], Wake] = lambda rows: EVERYONE
    ) -> None:
        """``wakes`` tells from the rows a write changed which long-polls it
        is news for (other servers hear it as :attr:`Change.wake`)."""
        self.url = url
        self.origin = new_origin()  # this server, among those on the database
        self._wakes = wakes
        # Committed write transactions that changed each table (by name),
        # here or on another server: a cached read of some tables taken
        # before their counts moved may be stale (see api/read_cache.py).
        # Missed changes (a listener that lost its connection) count as a
        # write to every table.
        self._writes: dict[str, int] = {}
        self._everything = 0
        self._writes_lock = threading.Lock()
        self._after_commit: list[Callable[[Sequence[object]], None]] = []
        # This server's writers queue here, blocked, rather than at the
        # database: SQLite's busy handler retries by sleeping, unfairly, and
        # under a burst of writes one could wait out its busy timeout and
        # fail; on PostgreSQL it keeps one connection, not every writer's,
        # waiting for the write lock.
        self._one_writer = threading.Lock()
        self.write_lock = WriteLockTimes()
        self._memos: dict[str, tuple[tuple[int, ...], Any]] = {}
        self._memo_locks: dict[str, threading.Lock] = {}
        self.kept_specs = KeptValues(KEPT_SPECS)
        self._listener: Listener | None = None
        self._lease: SweepLease | None = None
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

    def listen(self, heard: Callable[[Change], None]) -> None:
        """Hear what other servers on this database commit: their writes
        count as this one's (:meth:`writes_to`), then ``heard`` gets each
        (from the listener's thread). Returns once listening. SQLite: no
        other server shares the file; nothing to hear."""
        if self.is_sqlite or self._listener is not None:
            return

        def counted(change: Change) -> None:
            with self._writes_lock:
                if change.everything:
                    self._everything += 1
                for table in change.tables:
                    self._writes[table] = self._writes.get(table, 0) + 1
            heard(change)

        self._listener = Listener(self.url, self.origin, counted)
        self._listener.start()

    def sweeps(self, every_s: float) -> bool:
        """Whether this server is the one that sweeps (db/changes.py,
        SweepLease); asked every ``every_s``. On SQLite, the only server does."""
        if self.is_sqlite:
            return True
        if self._lease is None:
            self._lease = SweepLease(self.url, max(LEASE_SILENCE_S, 5 * every_s))
        return self._lease.held()

    @property
    def sweeping(self) -> bool:
        """Whether this server held the sweep lease at its last turn."""
        return self.is_sqlite or (self._lease is not None and self._lease.holds)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self._read_engine, expire_on_commit=False) as session:
            session.info[_DATABASE] = self
            yield session

    @contextmanager
    def write(
        self, *, exclusive: bool = True, row_wait_s: float | None = None
    ) -> Iterator[Session]:
        """A transaction that commits on success and rolls back on error.

        ``exclusive=False``, on PostgreSQL: without the write lock, beside
        the one writer that holds it, for a write that locks the rows it
        changes itself (``SELECT ... FOR UPDATE``) and decides nothing from
        rows that may move meanwhile: a node's report on its own part. On
        SQLite every write is exclusive (it has one writer).

        ``row_wait_s``, on PostgreSQL: a row another transaction holds is
        waited for at most this long, then :class:`RowsBusy` is raised
        (nothing written). For a write beside the writer that must never
        hold it up: were the writer to wait on one of its rows while it
        waits on one of the writer's, it gives up well before PostgreSQL's
        deadlock check (a second) would pick either to fail."""
        exclusive = exclusive or self.is_sqlite
        try:
            with self._transaction(exclusive, row_wait_s) as session:
                yield session
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                raise RowsBusy(str(exc.orig)) from exc
            raise

    @contextmanager
    def _transaction(self, exclusive: bool, row_wait_s: float | None) -> Iterator[Session]:
        with Session(self._write_engine, expire_on_commit=False) as session:
            rows, nodes = _noting_writes(session)
            session.info[_DATABASE] = self
            session.info[_EXCLUSIVE] = exclusive
            asked = time.perf_counter()
            with self._one_writer if exclusive else nullcontext():
                with session.begin():
                    self._begin(session, exclusive, row_wait_s)
                    taken = time.perf_counter()
                    yield session
                    if not self.is_sqlite:
                        session.flush()
                        if rows:  # delivered at commit, to every other server listening
                            counted = {_table_of(row) for row in rows} & MEMO_TABLES
                            if counted:
                                _count_changes(session, counted)
                            self._announce(session, rows, nodes)
                # Counted before the next writer begins: a memo it reads
                # (see memoized) is never older than what it sees.
                with self._writes_lock:
                    for table in {_table_of(row) for row in rows}:
                        self._writes[table] = self._writes.get(table, 0) + 1
                if exclusive:
                    self.write_lock.add(taken - asked, time.perf_counter() - taken)
        if rows:
            for callback in self._after_commit:
                callback(rows)

    def _begin(self, session: Session, exclusive: bool, row_wait_s: float | None) -> None:
        """A write transaction's first statements: its locks, its limits."""
        if self.is_sqlite:
            # BEGIN IMMEDIATE now rather than at the first statement: what
            # follows runs holding the lock (a grouped write takes its group
            # then, GroupedWrites).
            session.connection()
            return
        if exclusive:
            # One writer at a time, across every server on the database, as
            # SQLite's BEGIN IMMEDIATE: a claim's read and its write cannot be
            # overtaken between them.
            session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": WRITE_LOCK_KEY})
        if row_wait_s is not None:
            milliseconds = max(1, round(row_wait_s * 1000))
            session.execute(text(f"SET LOCAL lock_timeout = {milliseconds}"))

    def _announce(self, session: Session, rows: list[object], nodes: list[models.Node]) -> None:
        change = Change(
            origin=self.origin,
            tables=frozenset(_table_of(row) for row in rows),
            wake=self._wakes(rows),
            nodes=tuple(sorted({n.id for n in nodes if n.id is not None})),
        )
        session.execute(
            text("SELECT pg_notify(:channel, :payload)"),
            {"channel": CHANNEL, "payload": change.payload()},
        )

    def writes_to(self, tables: tuple[type, ...]) -> tuple[int, ...]:
        """How many committed transactions have changed each of these tables."""
        with self._writes_lock:
            return tuple(
                self._writes.get(_table_of(table), 0) + self._everything for table in tables
            )

    def dispose(self) -> None:
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        self.engine.dispose()


# Job specs placement keeps decoded: more than one person's queue cap.
KEPT_SPECS = 20_000


class KeptValues:
    """Values that never change once written (a job's spec), decoded once
    per server rather than at every read: placement reads the spec of every
    queued job, and decoding a thousand of them took longer than the rest
    of a submit. Keyed by what identifies the row for good (a job's id and
    its creation time: an id alone could name another job in a database
    made anew); the least recently used are dropped past ``size``."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._values: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self._size:
                self._values.popitem(last=False)


def kept_specs_of(session: Session) -> KeptValues | None:
    """The job specs this session's database keeps decoded (None: a session
    not from a :class:`Database`)."""
    database = session.info.get(_DATABASE)
    return database.kept_specs if isinstance(database, Database) else None


# The tables a memo may read (memoized): on PostgreSQL only their changes
# are counted in change_count. Counting every table a write touched made
# nearly every transaction update the same few rows, and a node's report
# written beside the writer (Database.write, exclusive=False) waited on the
# writer's lock of the parts row until it committed.
MEMO_TABLES = frozenset({"node"})


def _noting_writes(session: Session) -> tuple[list[object], list[models.Node]]:
    """The rows ``session``'s flushes write, and the nodes among them whose
    identity changed, noted as it goes (and how many statements of its own
    insert, update or delete rows: writes_made)."""
    rows: list[object] = []
    nodes: list[models.Node] = []

    def note(changed: Session, *_: object) -> None:
        rows.extend((*changed.new, *changed.deleted))
        rows.extend(row for row in changed.dirty if changed.is_modified(row))
        nodes.extend(row for row in (*changed.new, *changed.dirty) if _node_identity_changed(row))

    # Neither listener holds the session (it is handed to each): one that
    # did would make the session and its listeners a reference cycle, left
    # for the garbage collector's full passes, which stall the event loop.
    def counted(execution: ORMExecuteState) -> None:
        if execution.is_insert or execution.is_update or execution.is_delete:
            execution.session.info[_STATEMENTS_WRITTEN] += 1

    event.listen(session, "before_flush", note)
    event.listen(session, "do_orm_execute", counted)
    session.info[_WRITTEN] = rows
    session.info[_STATEMENTS_WRITTEN] = 0
    return rows, nodes


def writes_made(session: Session) -> int:
    """How many writes a write session has made so far: the rows its
    flushes wrote, and its statements that insert, update or delete rows
    themselves. The same before and after a span of work (flushed first):
    that work wrote nothing (its changes still pending aside)."""
    return len(session.info[_WRITTEN]) + int(session.info[_STATEMENTS_WRITTEN])


def note_written(session: Session, rows: Iterable[object]) -> None:
    """Rows a write changed with a statement of its own rather than through
    the session's objects (which its flushes note): counted, announced and
    passed to the commit's callbacks as those are (Database.write). Many
    rows of one table that no callback looks into (log lines) are noted
    as their model: the table changed."""
    session.info[_WRITTEN].extend(rows)


def memoized(session: Session, name: str, tables: tuple[type, ...], compute: Callable[[], T]) -> T:
    """What ``compute`` reads from ``tables`` in ``session``, computed again
    only once a committed write has changed one of them: placement and a
    submit's checks read every live node's row, which with thousands of
    nodes cost more than the rest of the transaction, and nodes change far
    more seldom than jobs. The value must not be changed by its users
    (but for a cache of what follows from it alone, as placement's LiveNodes).

    How it knows: on SQLite, where this server is the only writer and
    counts each write before the next begins (Database.write), from those
    counts; on PostgreSQL, from the change_count table, read in the
    session's own snapshot (another server's note arrives a moment after
    its commit, too late to go by). A session that has changed one of the
    tables itself computes."""
    names = tuple(_table_of(table) for table in tables)
    if not set(names) <= MEMO_TABLES:
        raise ValueError(f"memoized {name!r} reads {names}; MEMO_TABLES counts {MEMO_TABLES}")
    database = session.info.get(_DATABASE)
    if not isinstance(database, Database):
        return compute()
    touched = (*session.new, *session.dirty, *session.deleted, *session.info.get(_WRITTEN, ()))
    if any(_table_of(row) in names for row in touched):
        return compute()
    # Read before computing: a later write moves them.
    counts = database.writes_to(tables) if database.is_sqlite else _changes_seen(session, names)
    memo = database._memos.get(name)
    if memo is not None and memo[0] == counts:
        value: T = memo[1]
        return value
    # Computed by one session at a time: the moment a node changes, every
    # submit and plan in flight finds the memo stale together, and each
    # read every node's row (with 5,000 nodes, 16 submitters spent over a
    # second of one GIL on it at once). The others wait and take its value
    # if they see the same counts. The session's connection is taken first, so the one
    # computing never waits for the pool that those waiting hold.
    session.connection()
    with database._memo_locks.setdefault(name, threading.Lock()):
        memo = database._memos.get(name)
        if memo is not None and memo[0] == counts:
            value = memo[1]
            return value
        value = compute()
        database._memos[name] = (counts, value)
        return value


def _count_changes(session: Session, tables: set[str]) -> None:
    """PostgreSQL: one more committed change to each of these tables, in
    the transaction that makes it (so it commits, or not, with it)."""
    session.execute(
        text(
            "INSERT INTO change_count (table_name, count) VALUES (:table_name, 1) "
            "ON CONFLICT (table_name) DO UPDATE SET count = change_count.count + 1"
        ),
        [{"table_name": table} for table in sorted(tables)],
    )


def _changes_seen(session: Session, tables: tuple[str, ...]) -> tuple[int, ...]:
    """The change counts of these tables as ``session`` sees them: read
    once a session where they cannot move within its transaction (a read's
    snapshot; a write that holds the write lock counts its own changes only
    as it commits), at every call in a write beside the writer."""
    seen: dict[tuple[str, ...], tuple[int, ...]] = session.info.setdefault(_CHANGES_SEEN, {})
    if tables in seen:
        return seen[tables]
    statement = text(
        "SELECT table_name, count FROM change_count WHERE table_name IN :tables"
    ).bindparams(bindparam("tables", expanding=True))
    counted = {row[0]: row[1] for row in session.execute(statement, {"tables": list(tables)})}
    counts = tuple(int(counted.get(table, 0)) for table in tables)
    if session.info.get(_EXCLUSIVE, True):
        seen[tables] = counts
    return counts


def _table_of(row_or_model: object) -> str:
    model = row_or_model if isinstance(row_or_model, type) else type(row_or_model)
    return str(getattr(model, "__tablename__", model.__name__))


def _node_identity_changed(row: object) -> bool:
    """A node row whose credential or state is new: other servers reload
    the node's credential (a revoked node is refused everywhere)."""
    if not isinstance(row, models.Node):
        return False
    attrs = inspect(row).attrs
    return bool(attrs.credential_digest.history.has_changes() or attrs.state.history.has_changes())


# Connections kept open. Requests read from the server's thread pool (40
# threads): a connection beyond the pool is opened and closed around each
# use, which under load costs more than the read (SQLite: the file and its
# pragmas; PostgreSQL: a login). PostgreSQL's default of 100 connections
# leaves room for two servers at their most and their listeners.
SQLITE_POOL = {"pool_size": 40, "max_overflow": 10}
POSTGRES_POOL = {"pool_size": 20, "max_overflow": 20}


def _make_engine(url: str, is_sqlite: bool) -> Engine:
    if not is_sqlite:
        return create_engine(url, pool_pre_ping=True, **POSTGRES_POOL)

    database = make_url(url).database
    in_a_file = database is not None and database not in ("", ":memory:")
    if database is not None and in_a_file:
        Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        **(SQLITE_POOL if in_a_file else {}),  # in memory: one connection a thread
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
