"""What the other servers on one PostgreSQL database commit, heard as they
commit it (``LISTEN``/``NOTIFY``), and which one of them sweeps.

Each server keeps answers, plans and node credentials in memory, and
long-polls wait on an event in memory (api/read_cache.py, api/notifier.py,
api/credentials.py). With several servers on one database, a write that
commits through one must reach the others' memories too: every write
transaction sends, inside itself, a note of what it changed on
:data:`CHANNEL` (PostgreSQL delivers it at commit, and never for a rolled
back one), and each server listens there on a connection of its own.

A listener that lost its connection may have missed notes: once it is
back, it tells its server to treat everything as changed
(:attr:`Change.everything`).

SQLite has one server per database file: there is nothing to hear.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

CHANNEL = "ddpo_changes"
# PostgreSQL refuses a payload of 8000 bytes or more: a bigger change is
# sent as "everything changed".
MAX_PAYLOAD_BYTES = 7900
# A listener that lost its connection tries again this often.
RECONNECT_S = 1.0
# The advisory lock the sweeping server holds (on a connection of its own).
SWEEP_LOCK_KEY = 0x6464706E  # "ddpn"
# PostgreSQL ends the sweeper's session (and so frees the lock) once it has
# been silent this long: a server that froze, or whose host vanished without
# closing its connections, stops holding the lease within it. The sweeper
# speaks on it every sweep interval.
LEASE_SILENCE_S = 10.0


@dataclass(frozen=True)
class Wake:
    """Which long-polls a committed write is news for: those of the nodes
    it gave, stopped or ended a part on, those waiting for a rendezvous
    port (a port just known), or every one. A poll woken for nothing costs
    a database read: with thousands of nodes polling, waking all of them
    for each placement would cost more than the placements."""

    nodes: frozenset[int] = frozenset()
    port_waiters: bool = False
    everyone: bool = False

    def __bool__(self) -> bool:
        return self.everyone or self.port_waiters or bool(self.nodes)


EVERYONE = Wake(everyone=True)


@dataclass(frozen=True)
class Change:
    """One committed write transaction, as the other servers hear of it."""

    origin: str  # the server that committed it
    tables: frozenset[str]
    wake: Wake  # news for long-polls: something to start, stop or rendezvous
    nodes: tuple[int, ...]  # nodes whose credential or state changed
    everything: bool = False  # notes may have been missed: assume all changed

    def payload(self) -> str:
        note = {
            "o": self.origin,
            "t": sorted(self.tables),
            "w": sorted(self.wake.nodes),
            "p": self.wake.port_waiters,
            "a": self.wake.everyone,
            "n": list(self.nodes),
        }
        text = json.dumps(note, separators=(",", ":"))
        if len(text.encode()) <= MAX_PAYLOAD_BYTES:
            return text
        return json.dumps({"o": self.origin, "e": True}, separators=(",", ":"))

    @classmethod
    def parse(cls, payload: str) -> Change:
        data: dict[str, Any] = json.loads(payload)
        if data.get("e"):
            return cls.all_of(str(data["o"]))
        return cls(
            origin=str(data["o"]),
            tables=frozenset(str(t) for t in data.get("t", ())),
            wake=Wake(
                nodes=frozenset(int(n) for n in data.get("w", ())),
                port_waiters=bool(data.get("p")),
                everyone=bool(data.get("a")),
            ),
            nodes=tuple(int(n) for n in data.get("n", ())),
        )

    @classmethod
    def all_of(cls, origin: str) -> Change:
        return cls(origin=origin, tables=frozenset(), wake=EVERYONE, nodes=(), everything=True)


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+psycopg://...``) as psycopg takes it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def new_origin() -> str:
    return uuid.uuid4().hex[:12]


class Listener:
    """A thread holding one connection that LISTENs on :data:`CHANNEL`;
    ``heard`` gets every change another server committed (from that
    thread)."""

    def __init__(self, url: str, origin: str, heard: Callable[[Change], None]) -> None:
        self._url = libpq_url(url)
        self._origin = origin
        self._heard = heard
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddpo-listen", daemon=True)

    def start(self, timeout_s: float = 30.0) -> None:
        """Start, and return once it listens: a change committed after this
        returns is heard."""
        self._thread.start()
        if not self._listening.wait(timeout_s):
            raise TimeoutError(f"could not LISTEN on the database within {timeout_s} s")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import psycopg

        first = True
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._url, autocommit=True) as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    self._listening.set()
                    if not first:  # what was committed while we were away is unknown
                        log.warning("listening for other servers' changes again")
                        self._heard(Change.all_of(self._origin))
                    first = False
                    while not self._stop.is_set():
                        for note in connection.notifies(timeout=1.0):
                            self._take(note.payload)
            except Exception:  # psycopg.Error, or a bad note: listen again
                if self._stop.is_set():
                    return
                log.exception("lost the connection that hears other servers' changes")
                self._stop.wait(RECONNECT_S)

    def _take(self, payload: str) -> None:
        change = Change.parse(payload)
        if change.origin != self._origin:
            self._heard(change)


class SweepLease:
    """Whether this server is the one that sweeps: a session-level advisory
    lock, held on a connection of its own for as long as this server lives.
    A server that dies drops its connection, and with it the lock: another
    takes it at its next try (within a sweep interval). One that freezes or
    loses its host is cut off by PostgreSQL after ``silence_s``."""

    def __init__(self, url: str, silence_s: float = LEASE_SILENCE_S) -> None:
        self._url = libpq_url(url)
        self._silence_ms = int(silence_s * 1000)
        self._connection: Any = None
        self._holds = False

    @property
    def holds(self) -> bool:
        """As :meth:`held` last found (no query)."""
        return self._holds

    def held(self) -> bool:
        """True if this server holds the lease (taking it if it is free)."""
        import psycopg

        try:
            if self._connection is None or self._connection.closed:
                self._connection, self._holds = psycopg.connect(self._url, autocommit=True), False
                self._connection.execute(f"SET idle_session_timeout = {self._silence_ms}")
            if self._holds:
                self._connection.execute("SELECT 1")  # ours for as long as it lives
                return True
            row = self._connection.execute(
                "SELECT pg_try_advisory_lock(%s)", (SWEEP_LOCK_KEY,)
            ).fetchone()
            self._holds = bool(row and row[0])
            if self._holds:
                log.info("this server sweeps now (it holds the sweep lease)")
            return self._holds
        except psycopg.Error as exc:
            log.warning("could not check the sweep lease: %s", exc)
            self.release()
            return False

    def release(self) -> None:
        if self._connection is not None:
            try:
                if self._holds:
                    # Unlocked before the connection closes: the backend drops a
                    # closed connection's locks only once its process has ended,
                    # a moment later, and the next server's try may come first.
                    self._connection.execute("SELECT pg_advisory_unlock(%s)", (SWEEP_LOCK_KEY,))
            except Exception:  # a broken connection: closing it frees the lock
                log.debug("unlocking the sweep lease failed", exc_info=True)
            try:
                self._connection.close()
            except Exception:  # closing a broken connection
                log.debug("closing the sweep lease's connection failed", exc_info=True)
            self._connection, self._holds = None, False
