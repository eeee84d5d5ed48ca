"""The node's sign of life, sent from a thread of its own.

The daemon's loop blocks for seconds at a time: launching a part, uploading
a checkpoint over a slow link, shipping a large batch of logs. A heartbeat
tied to that loop goes quiet exactly when the node is busiest, and the
server would take a working node for a lost one. This thread beats every
``interval_s`` on a connection of its own, whatever the loop is doing, and
stops the parts the server says are no longer this node's: after a
partition heals, that is within one beat, even if the loop is still stuck
in a request that was cut off. A cooperative stop (checkpoint at a step,
then end) reaches the parts this way too, when the loop is busy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ddpo.schemas import StopRequest
from worker.client import Refused, ServerClient, ServerUnavailable

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        *,
        server_url: str,
        credential: str | None,
        node_id: int,
        interval_s: float,
        active_part_ids: Callable[[], list[int]],
        stop_parts: Callable[[list[int]], None],
        ask_parts: Callable[[list[StopRequest]], None] = lambda _: None,
        polled_at: Callable[[], float] = lambda: float("-inf"),
    ) -> None:
        """``polled_at``: when (monotonic) the server last had a poll from the
        daemon (one it answered, or the one it holds open now); a beat
        within an interval of it would tell the server nothing new (a poll
        is a sign of life too, and says what to stop), so it is skipped: an
        idle node costs the server one request per poll, not two. A daemon
        busy elsewhere (a launch, an upload) polls not, and beats."""
        # A beat never outlasts its period: a late answer is worth less than
        # the next beat.
        self._client = ServerClient(server_url, timeout_s=interval_s)
        self._client.credential = credential
        self._node_id = node_id
        self._interval_s = interval_s
        self._active_part_ids = active_part_ids
        self._stop_parts = stop_parts
        self._ask_parts = ask_parts
        self._polled_at = polled_at
        self._closed = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._thread.join(self._interval_s + 1)
        self._client.close()

    def _run(self) -> None:
        while not self._closed.wait(self._interval_s):
            if time.monotonic() - self._polled_at() >= self._interval_s:
                self.beat()

    def beat(self) -> None:
        try:
            answer = self._client.heartbeat(self._node_id, self._active_part_ids())
        except (ServerUnavailable, Refused) as exc:
            # The loop sees the same trouble on its own requests and acts on
            # it (registers again, exits if revoked); a line here is enough.
            if not self._failing:
                log.warning("heartbeat not taken: %s", exc)
            self._failing = True
            return
        if self._failing:
            log.info("heartbeat taken again")
        self._failing = False
        if answer.stop:
            self._stop_parts(answer.stop)
        if answer.checkpoint_and_stop:
            self._ask_parts(answer.checkpoint_and_stop)
