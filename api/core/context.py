"""What every command of the core shares: the database, the settings, the
node credentials the auth layer checks, and when each node was last heard."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from api.credentials import NodeCredentials
from api.settings import ServerSettings
from db.engine import Database


class Sightings:
    """node id -> when a request from it last arrived (monotonic). Any
    request proves a node alive, and it is noted before the request waits
    for the database: a node stuck behind a busy server is not a lost node."""

    def __init__(self) -> None:
        self._listening_since = time.monotonic()
        self._seen: dict[int, float] = {}
        self._lock = threading.Lock()

    def saw(self, node_id: int) -> None:
        with self._lock:
            self._seen[node_id] = time.monotonic()

    def seen_within(self, node_id: int, seconds: float) -> bool:
        with self._lock:
            seen = self._seen.get(node_id)
        return seen is not None and time.monotonic() - seen < seconds

    def listening_for(self) -> float:
        """Seconds since this server started hearing nodes."""
        return time.monotonic() - self._listening_since


class JoinRate:
    """New nodes joining in the last minute: at most ``per_minute``, so a
    leaked join token cannot fill the server with nodes at once."""

    WINDOW_S = 60.0

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._joins: list[float] = []
        self._lock = threading.Lock()

    def admit(self) -> float:
        """0 and the join counted, or the seconds until one may join."""
        now = time.monotonic()
        with self._lock:
            self._joins = [t for t in self._joins if now - t < self.WINDOW_S]
            if len(self._joins) >= self.per_minute:
                return self.WINDOW_S - (now - self._joins[0])
            self._joins.append(now)
            return 0.0


@dataclass
class Core:
    db: Database
    settings: ServerSettings
    credentials: NodeCredentials = field(default_factory=NodeCredentials)
    sightings: Sightings = field(default_factory=Sightings)
    joins: JoinRate = field(init=False)

    def __post_init__(self) -> None:
        self.joins = JoinRate(self.settings.registrations_per_minute)
