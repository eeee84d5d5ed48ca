"""Wakes long-polling workers when something they may care about changed.

Each node's poll waits on an event of its own, so news for one node (a
part given to it, or to stop) wakes that node's poll alone: with thousands
of idle nodes polling, waking every poll for each placement would make
each placement cost a read per node. A rendezvous port just known wakes
the polls waiting for one; a change that may have been missed (another
server's notes lost) wakes everyone.

Route handlers that write run in a thread pool, the waiting polls on the
event loop; :meth:`Notifier.wake` may be called from either.
"""

from __future__ import annotations

import asyncio
import contextlib

from db.changes import Wake


class News:
    """One node's next wake, set once (on the event loop): what a poll
    waits on. Not an asyncio.Event, whose wait under asyncio.wait_for
    costs every held poll a task of its own and, at its timeout, that
    task's cancellation: with hundreds of polls a second held to their
    timeout, several percent of an idle server's CPU (BENCHMARKS.md). A
    wait here is one future and one timer."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] = []

    def is_set(self) -> bool:
        return self._set

    @property
    def waiting(self) -> int:
        """Polls waiting on it now."""
        return len(self._waiters)

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            _settle(waiter)


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Notifier:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: dict[int, News] = {}
        self._port_waiters: set[int] = set()
        # Wakes so far, per node and for everyone (see stamp).
        self._news: dict[int, int] = {}
        self._news_for_everyone = 0

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def current(self, node_id: int, waits_for_port: bool = False) -> News:
        """The event the next wake for this node sets (from the event loop).
        Take it *before* looking at the database, so a change made between
        the look and the wait is not missed."""
        if self._loop is None:
            raise RuntimeError("Notifier.bind() was not called")
        event = self._events.get(node_id)
        if event is None:
            event = self._events[node_id] = News()
        if waits_for_port:
            self._port_waiters.add(node_id)
        return event

    def stamp(self, node_id: int) -> tuple[int, int]:
        """Moves with every wake for this node (from the event loop): an
        answer read after taking it stands while it has not moved."""
        return self._news_for_everyone, self._news.get(node_id, 0)

    def wake(self, wake: Wake) -> None:
        if self._loop is None or not wake:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._fire(wake)
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._fire, wake)

    def _fire(self, wake: Wake) -> None:
        if wake.everyone:
            self._news_for_everyone += 1
            nodes: set[int] = set(self._events)
        else:
            for node_id in wake.nodes:
                self._news[node_id] = self._news.get(node_id, 0) + 1
            nodes = set(wake.nodes)
            if wake.port_waiters:
                nodes |= self._port_waiters
        for node_id in nodes:
            self._port_waiters.discard(node_id)
            event = self._events.pop(node_id, None)
            if event is not None:
                event.set()

    @staticmethod
    async def wait(news: News, timeout: float) -> bool:
        """Whether it was set within ``timeout``."""
        if news.is_set():
            return True
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        news._waiters.append(waiter)
        timer = loop.call_later(timeout, _settle, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            # Timed out or cancelled (the node hung up): no longer waiting.
            # (Set: set() has taken it already.)
            with contextlib.suppress(ValueError):
                news._waiters.remove(waiter)
        return news.is_set()
