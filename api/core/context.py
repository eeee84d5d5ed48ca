"""What every command of the core shares: the database, the settings, the
node credentials and people's keys the auth layer checks, and when each node was last heard."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from sqlmodel import Session

from api.credentials import ApiKeys, NodeCredentials
from api.settings import ServerSettings
from api.tracking import Tracking
from db.engine import Database
from ddpo.schemas.protocol import MAX_LOG_LINES_PER_BATCH

T = TypeVar("T")


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


# Writes one grouped transaction takes at most: each costs the writer a
# few milliseconds, so under a long burst a transaction ends and commits
# within a second or so rather than growing with the burst.
GROUP_MOST = 64


# Whether the queue needs planning after a write: yes or no, or a check
# asked only if no other write of its group has said yes already (a group
# that plans anyway need not ask whether a submit could start).
PlanNeed = bool | Callable[[], bool]


# Writes of one kind made together: given the session and what each of
# them asks, in the order they came, returns for each its value and
# whether the queue needs planning after it, or the error refusing it
# (a refused one must have written nothing).
Together = Callable[[Session, list[Any]], list[tuple[Any, PlanNeed] | Exception]]


@dataclass(eq=False)
class Grouped(Generic[T]):
    """One caller's write waiting to be made in a grouped transaction
    (:class:`GroupedWrites`): ``work`` makes it in the session it is given
    and returns its value and whether the queue needs planning after it.

    A write of a kind that is cheaper made many at once (one statement for
    many rows, a round trip to the database instead of one each) names
    ``together``: the group's writes naming the same one are made by one
    call of it with their ``asked``, where the group is written without a
    savepoint each; ``work`` makes it alone otherwise."""

    work: Callable[[Session], tuple[T, PlanNeed]]
    together: Together | None = None
    asked: Any = None
    value: T | None = None
    need: PlanNeed = False
    error: BaseException | None = None
    done: bool = False


class GroupedWrites:
    """Writes that arrive while another holds the writer, made together in
    the next transaction (a group commit): under a burst of submits and
    node reports, one transaction (one turn of the write lock, one commit,
    one plan of the queue) serves dozens of callers rather than one each.
    Whoever finds no group being written writes the next one, in its own
    thread, until its own has been written; the others wait for it.

    The writer takes its group (the oldest :data:`GROUP_MOST` waiting, in
    the order they came) only once it holds the database's write lock
    (``take``, below): with several servers on one database, the writes
    that arrive while another server's transaction holds the lock join this
    one's, where a group taken before waiting for the lock would leave them
    for the turn after."""

    def __init__(self, most: int = GROUP_MOST) -> None:
        self.most = most
        self._changed = threading.Condition()
        self._waiting: deque[Grouped[Any]] = deque()
        self._writing = False

    @property
    def waiting(self) -> int:
        """Writes waiting for a group (not the one being written)."""
        with self._changed:
            return len(self._waiting)

    def run(
        self, grouped: Grouped[Any], write: Callable[[Callable[[], list[Grouped[Any]]]], None]
    ) -> None:
        """Returns once ``grouped`` is done: ``write`` has taken it in a
        group, in this thread or another. ``write`` is given ``take``, which
        returns its group (taken from those waiting at its first call, the
        same list after), and sets each one's value or error. If ``write``
        raises, every one in its group without an error of its own ends with
        that one (the group taken then if ``write`` had not)."""
        with self._changed:
            self._waiting.append(grouped)
        while True:
            with self._changed:
                while self._writing and not grouped.done:
                    self._changed.wait()
                if grouped.done:
                    return
                self._writing = True
            take = self._taker()
            try:
                write(take)
            except Exception as exc:  # every one in the group fails with it
                for one in take():
                    if one.error is None:
                        one.error = exc
            finally:
                group = take()
                with self._changed:
                    for one in group:
                        one.done = True
                    self._writing = False
                    self._changed.notify_all()

    def _taker(self) -> Callable[[], list[Grouped[Any]]]:
        """A writer's ``take``: the oldest writes waiting, taken at its first
        call, the same list at every call after."""
        taken: list[Grouped[Any]] = []

        def take() -> list[Grouped[Any]]:
            if not taken:
                with self._changed:
                    most = min(self.most, len(self._waiting))
                    taken.extend(self._waiting.popleft() for _ in range(most))
            return taken

        return take


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
    writes: GroupedWrites = field(default_factory=GroupedWrites)
    uploads: Uploads = field(default_factory=Uploads)
    # Where reports are written on (TensorBoard, MLflow): api/main.py sets
    # this server's; none by default.
    tracking: Tracking = field(default_factory=lambda: Tracking([]))

    def __post_init__(self) -> None:
        self.joins = JoinRate(self.settings.registrations_per_minute)
        self.log_rate = LogRate(
            self.settings.log_lines_per_second_per_node, MAX_LOG_LINES_PER_BATCH
        )
