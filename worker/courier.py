"""The daemon's one way of handling a failed request to the server. A
server that cannot be reached now is tried again later: the daemon says so
once, and backs off (up to :data:`MAX_BACKOFF_S`) until it answers. A
report the server refuses is dropped with a warning: sending it again
would be refused again."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from worker.client import Refused, ServerClient, ServerUnavailable

log = logging.getLogger(__name__)

FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 5.0


class Courier:
    def __init__(self, client: ServerClient) -> None:
        self.client = client
        self._down_since: float | None = None
        self._backoff_s = FIRST_BACKOFF_S

    def deliver(self, what: str, send: Callable[[], object]) -> bool:
        """``send()``; False if the server could not be reached (try again
        later), True if it took the request or refused it for good."""
        try:
            send()
        except ServerUnavailable as exc:
            self.unavailable(exc)
            return False
        except Refused as exc:
            log.warning("%s refused: %s", what, exc)
        else:
            self.available()
        return True

    def unavailable(self, exc: Exception) -> None:
        """The server did not answer: say so once, then wait a little longer each time."""
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("server unavailable (%s); retrying", exc)
        time.sleep(self._backoff_s)
        self._backoff_s = min(self._backoff_s * 2, MAX_BACKOFF_S)

    def available(self) -> None:
        if self._down_since is not None:
            log.info("server reachable again after %.1f s", time.monotonic() - self._down_since)
        self._down_since = None
        self._backoff_s = FIRST_BACKOFF_S
