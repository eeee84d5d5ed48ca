"""Wakes long-polling workers when something they may care about changed.

Route handlers that write run in a thread pool, the waiting polls on the
event loop; :meth:`Notifier.notify` may be called from either.
"""

from __future__ import annotations

import asyncio
import contextlib


class Notifier:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        """The event the next :meth:`notify` sets. Take it *before* looking at
        the database, so a change made between the look and the wait is not
        missed."""
        if self._event is None:
            raise RuntimeError("Notifier.bind() was not called")
        return self._event

    def notify(self) -> None:
        if self._loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._fire()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        previous, self._event = self._event, asyncio.Event()
        if previous is not None:
            previous.set()

    @staticmethod
    async def wait(event: asyncio.Event, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
