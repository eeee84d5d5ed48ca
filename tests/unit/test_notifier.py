"""Long-polls are woken for news of their own node only (api/notifier.py):
with thousands of idle nodes polling, one placement wakes one poll."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading

from api.notifier import Notifier
from db.changes import Wake


def test_news_for_a_node_wakes_its_poll_and_no_other() -> None:
    async def check() -> None:
        notifier = Notifier()
        notifier.bind(asyncio.get_running_loop())
        one, two = notifier.current(1), notifier.current(2)
        notifier.wake(Wake(nodes=frozenset({1})))
        assert one.is_set() and not two.is_set()
        assert not notifier.current(1).is_set()  # the next poll waits for the next news

    asyncio.run(check())


def test_a_known_port_wakes_the_polls_waiting_for_one() -> None:
    async def check() -> None:
        notifier = Notifier()
        notifier.bind(asyncio.get_running_loop())
        waiting, idle = notifier.current(1, waits_for_port=True), notifier.current(2)
        notifier.wake(Wake(port_waiters=True))
        assert waiting.is_set() and not idle.is_set()
        again = notifier.current(1)  # this poll no longer waits for a port
        notifier.wake(Wake(port_waiters=True))
        assert not again.is_set()

    asyncio.run(check())


def test_a_change_that_may_have_been_missed_wakes_everyone_even_from_a_thread() -> None:
    async def check() -> None:
        notifier = Notifier()
        notifier.bind(asyncio.get_running_loop())
        events = [notifier.current(n) for n in range(5)]
        thread = threading.Thread(target=notifier.wake, args=(Wake(everyone=True),))
        thread.start()
        thread.join()
        assert all([await notifier.wait(e, 5.0) for e in events])
        assert not await notifier.wait(notifier.current(0), 0.01)

    asyncio.run(check())


def test_a_poll_that_ends_unwoken_leaves_nothing_waiting() -> None:
    """A poll held to its timeout, or given up (the node hung up: its task
    cancelled), stops waiting on its node's news; a wake after finds no
    one to wake, and the next poll waits afresh."""

    async def check() -> None:
        notifier = Notifier()
        notifier.bind(asyncio.get_running_loop())
        news = notifier.current(7)
        assert not await notifier.wait(news, 0.001)
        assert news.waiting == 0
        held = asyncio.ensure_future(notifier.wait(news, 60.0))
        while news.waiting == 0:  # the poll's task has started waiting
            await asyncio.sleep(0)
        held.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await held
        assert held.cancelled() and news.waiting == 0
        notifier.wake(Wake(nodes=frozenset({7})))
        assert news.is_set() and await notifier.wait(news, 60.0)

    asyncio.run(check())


def test_a_poll_held_to_its_timeout_leaves_no_garbage_for_the_collector() -> None:
    """Most held polls end at their timeout, hundreds a second: each one
    must leave nothing in reference cycles, whose collection stops the
    event loop (the slow tail of polls, BENCHMARKS.md)."""

    async def held_polls() -> None:
        notifier = Notifier()
        notifier.bind(asyncio.get_running_loop())
        for node_id in range(50):
            assert not await notifier.wait(notifier.current(node_id), 0.001)

    gc.collect()
    gc.disable()
    try:
        asyncio.run(held_polls())
        left_in_cycles = gc.collect()
    finally:
        gc.enable()
    # None here; a wait through asyncio.wait (a waiter future and a timer
    # per wait, tried once) left 328.
    assert left_in_cycles < 50, left_in_cycles
