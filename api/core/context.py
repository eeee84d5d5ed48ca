"""What every command of the core shares: the database, the settings, the
node credentials and people's keys the auth layer checks, and when each node was last heard."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from api.credentials import ApiKeys, NodeCredentials
from api.settings import ServerSettings
from api.tracking import Tracking
from db.engine import Database
from ddpo.schemas.protocol import MAX_LOG_LINES_PER_BATCH


class Sightings:
    """node id -> when a request from it last arrived (monotonic). Any
    request proves a node alive, and it is noted before the request waits
    for the database: a node stuck behind a busy server is not a lost node.

    The sightings reach the database in one write a sweep interval
    (:meth:`take_unwritten`, api/core/clock.py), as the nodes' heartbeat
    times: whichever server a node reached, the one that sweeps sees it,
    and a poll or a heartbeat costs a read, not a write."""

    def __init__(self) -> None:
        self._listening_since = time.monotonic()
        self._seen: dict[int, float] = {}
        self._unwritten: set[int] = set()
        self._lock = threading.Lock()

    def saw(self, node_id: int) -> None:
        with self._lock:
            self._seen[node_id] = time.monotonic()
            self._unwritten.add(node_id)

    def seen_within(self, node_id: int, seconds: float) -> bool:
        with self._lock:
            seen = self._seen.get(node_id)
        return seen is not None and time.monotonic() - seen < seconds

    def take_unwritten(self) -> list[int]:
        """The nodes seen since the last take (give them back with
        :meth:`put_back` if they could not be written)."""
        with self._lock:
            taken, self._unwritten = self._unwritten, set()
        return sorted(taken)

    def put_back(self, node_ids: list[int]) -> None:
        with self._lock:
            self._unwritten.update(node_ids)

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


class LogRate:
    """Log lines each node may send: ``per_s`` a second on average, up to
    ``burst`` at once (a token bucket per node), so one node's flood cannot
    fill the database or hold the write lock from everyone else."""

    def __init__(self, per_s: float, burst: int) -> None:
        self.per_s = per_s
        self.burst = burst
        self._buckets: dict[int, tuple[float, float]] = {}  # node -> (tokens, when)
        self._lock = threading.Lock()

    def admit(self, node_id: int, lines: int) -> float:
        """0 and the lines counted, or the seconds until that many may come."""
        now = time.monotonic()
        with self._lock:
            tokens, since = self._buckets.get(node_id, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - since) * self.per_s)
            if lines > tokens:
                self._buckets[node_id] = (tokens, now)
                return (min(lines, self.burst) - tokens) / self.per_s
            self._buckets[node_id] = (tokens - lines, now)
            return 0.0


class Uploads:
    """Checkpoint uploads arriving now: one at a time per part (a node
    cannot open many at once), and their bytes so far (against the quota)."""

    def __init__(self) -> None:
        self._bytes: dict[int, int] = {}
        self._kept = 0  # bytes of every upload kept so far
        self._lock = threading.Lock()

    def begin(self, part_id: int) -> bool:
        """False if the part is uploading already."""
        with self._lock:
            if part_id in self._bytes:
                return False
            self._bytes[part_id] = 0
            return True

    def grow(self, part_id: int, size: int, room: int) -> bool:
        """Count the upload at ``size`` bytes if all arriving now fit in
        ``room`` together; False (and nothing counted) if not. Charged as the
        bytes arrive: concurrent uploads cannot each take the whole room."""
        with self._lock:
            others = sum(n for part, n in self._bytes.items() if part != part_id)
            if others + size > room:
                return False
            self._bytes[part_id] = size
            return True

    def kept(self, size: int) -> None:
        with self._lock:
            self._kept += size

    def kept_so_far(self) -> int:
        with self._lock:
            return self._kept

    def end(self, part_id: int) -> None:
        with self._lock:
            self._bytes.pop(part_id, None)


class Coalesced:
    """Work that one run does for everyone who asked before it began (the
    queue's plan): while a run is in progress, those who ask meanwhile wait
    and the next run covers them all. Under a burst of submits and reports,
    one plan places the jobs of many, rather than a plan each, every one of
    them a pass over the queue and every node under the write lock."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._asked = 0  # tickets handed out
        self._covered = 0  # the last ticket a finished run was asked for
        self._running = False
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Callers waiting for a run to end."""
        with self._changed:
            return self._waiting

    def run(self, work: Callable[[], None]) -> None:
        """Returns once a run of ``work`` that began after this call has
        ended: this thread's, or another's that took its ticket too.
        ``work`` raising ends that run for all it covered (and raises here
        only in the thread that ran it)."""
        with self._changed:
            self._asked += 1
            ticket = self._asked
            while self._covered < ticket:
                if not self._running:
                    self._running = True
                    covers = self._asked
                    break
                self._waiting += 1
                self._changed.wait()
                self._waiting -= 1
            else:
                return
        try:
            work()
        finally:
            with self._changed:
                self._running = False
                self._covered = covers
                self._changed.notify_all()


@dataclass
class PlanMemo:
    """What the tick's last plan was made from: the write counts of the
    tables placement reads, and when the first retry still waiting for its
    backoff becomes due. While both hold, a new plan would come out the same,
    and a tick skips it: its cost follows what changes, not how many nodes
    and queued jobs there are."""

    writes: tuple[int, ...] | None = None
    next_due: datetime | None = None

    def still_holds(self, writes: tuple[int, ...], now: datetime) -> bool:
        return writes == self.writes and (self.next_due is None or now < self.next_due)


@dataclass
class Core:
    db: Database
    settings: ServerSettings
    credentials: NodeCredentials = field(default_factory=NodeCredentials)
    keys: ApiKeys = field(default_factory=ApiKeys)
    sightings: Sightings = field(default_factory=Sightings)
    joins: JoinRate = field(init=False)
    log_rate: LogRate = field(init=False)
    plan_memo: PlanMemo = field(default_factory=PlanMemo)
    plans: Coalesced = field(default_factory=Coalesced)
    uploads: Uploads = field(default_factory=Uploads)
    # Where reports are written on (TensorBoard, MLflow): api/main.py sets
    # this server's; none by default.
    tracking: Tracking = field(default_factory=lambda: Tracking([]))

    def __post_init__(self) -> None:
        self.joins = JoinRate(self.settings.registrations_per_minute)
        self.log_rate = LogRate(
            self.settings.log_lines_per_second_per_node, MAX_LOG_LINES_PER_BATCH
        )
