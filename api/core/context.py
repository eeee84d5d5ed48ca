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


@dataclass
class Core:
    db: Database
    settings: ServerSettings
    credentials: NodeCredentials = field(default_factory=NodeCredentials)
    sightings: Sightings = field(default_factory=Sightings)
