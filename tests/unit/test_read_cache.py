from __future__ import annotations

import time
from typing import Any

import pytest

from api.read_cache import ReadCache


class Job:
    pass


class Node:
    pass


class FakeDatabase:
    def __init__(self) -> None:
        self.writes: dict[type, int] = {Job: 0, Node: 0}

    def writes_to(self, tables: tuple[type, ...]) -> tuple[int, ...]:
        return tuple(self.writes[t] for t in tables)


def make(ttl_s: float, max_entries: int = 100) -> tuple[Any, ReadCache]:
    db = FakeDatabase()
    cache = ReadCache(db, ttl_s=ttl_s, max_entries=max_entries)  # type: ignore[arg-type]
    return db, cache


def read(db: Any, cache: ReadCache, key: str = "k") -> tuple[bytes, bool]:
    """The answer, and whether the database was read for it."""
    computed: list[bool] = []

    def compute() -> bytes:
        computed.append(True)
        return f"answer after {db.writes[Job]} writes".encode()

    return cache.get(key, compute, (Job,)), bool(computed)


def test_an_answer_is_shared_until_the_next_write() -> None:
    db, cache = make(ttl_s=60)
    first, computed = read(db, cache)
    assert computed
    assert read(db, cache) == (first, False)
    assert read(db, cache, "other")[1]  # per key
    db.writes[Node] += 1  # a table the answer was not read from
    assert read(db, cache) == (first, False)
    db.writes[Job] += 1
    assert read(db, cache) == (b"answer after 1 writes", True)


def test_an_answer_expires_without_writes_too() -> None:
    db, cache = make(ttl_s=0.05)
    read(db, cache)
    deadline = time.monotonic() + 5
    while not read(db, cache)[1]:  # served from the cache until it expires
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_errors_are_not_kept() -> None:
    _, cache = make(ttl_s=60)

    def fails() -> bytes:
        raise LookupError("not found")

    with pytest.raises(LookupError):
        cache.get("k", fails, (Job,))
    assert cache.get("k", lambda: b"now it exists", (Job,)) == b"now it exists"


def test_the_oldest_entries_make_way() -> None:
    db, cache = make(ttl_s=60, max_entries=2)
    for key in ("a", "b", "c"):
        read(db, cache, key)
    assert read(db, cache, "a")[1]  # "a" was dropped
    assert not read(db, cache, "c")[1]


def test_the_cache_holds_at_most_its_bytes_whatever_the_keys() -> None:
    db = FakeDatabase()
    cache = ReadCache(db, ttl_s=60, max_entries=10_000, max_bytes=10_000)  # type: ignore[arg-type]
    for i in range(500):  # ?v=1, ?v=2, ... each a new entry of a large answer
        cache.get(("/jobs/1/logs", f"v={i}"), lambda: b"x" * 3000, (Job,))
    assert 0 < cache.size_bytes <= 10_000
    assert cache.peek(("/jobs/1/logs", "v=499")) is not None  # the newest stay
    assert cache.peek(("/jobs/1/logs", "v=0")) is None


def test_answers_past_their_time_are_dropped_not_just_skipped() -> None:
    db = FakeDatabase()
    cache = ReadCache(db, ttl_s=0.05)  # type: ignore[arg-type]
    for i in range(50):
        cache.get(("/jobs", str(i)), lambda: b"y" * 1000, (Job,))
    assert cache.size_bytes > 1000
    time.sleep(0.06)  # past the time limit (what is measured, not a synchronisation)
    cache.get(("/jobs", "next"), lambda: b"z", (Job,))
    assert cache.size_bytes == 1
