"""Core.plans: callers at the same time share one plan (api/core/context.py)."""

from __future__ import annotations

import threading

import pytest

from api.core.context import Coalesced
from tests.api.conftest import wait_for


def test_callers_during_a_run_wait_for_the_next_and_share_it() -> None:
    coalesced = Coalesced()
    events: list[str] = []
    first_began, release = threading.Event(), threading.Event()

    def work() -> None:
        events.append("run began")
        if not first_began.is_set():
            first_began.set()
            assert release.wait(10)

    def call() -> None:
        coalesced.run(work)
        events.append("returned")

    first = threading.Thread(target=call)
    first.start()
    assert first_began.wait(10)
    others = [threading.Thread(target=call) for _ in range(5)]
    for thread in others:
        thread.start()
    wait_for(lambda: coalesced.waiting == 5, what="five callers waiting on the first run")
    release.set()
    for thread in [first, *others]:
        thread.join(10)
    # The first run covered only its own caller; the five that asked while
    # it ran were answered by one run that began after they asked.
    assert events.count("run began") == 2
    second_run = events.index("run began", 1)
    assert events[:second_run].count("returned") <= 1  # the first caller's, at most
    assert events.count("returned") == 6
    assert coalesced.waiting == 0


def test_a_caller_alone_runs_its_own_work_every_time() -> None:
    coalesced = Coalesced()
    runs: list[int] = []
    for n in range(3):
        coalesced.run(lambda n=n: runs.append(n))
    assert runs == [0, 1, 2]


def test_work_that_raises_raises_in_the_caller_that_ran_it_and_the_next_call_runs_again() -> None:
    coalesced = Coalesced()

    def broken() -> None:
        raise RuntimeError("database gone")

    with pytest.raises(RuntimeError, match="database gone"):
        coalesced.run(broken)
    ran: list[bool] = []
    coalesced.run(lambda: ran.append(True))
    assert ran == [True]
