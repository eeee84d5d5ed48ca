"""The notes servers on one PostgreSQL database send each other about
what they committed (db/changes.py)."""

from __future__ import annotations

from db.changes import MAX_PAYLOAD_BYTES, Change, Wake


def test_a_change_crosses_as_it_was_sent() -> None:
    for wake in (Wake(nodes=frozenset({4, 9})), Wake(port_waiters=True), Wake(everyone=True)):
        sent = Change(origin="a1", tables=frozenset({"job", "part"}), wake=wake, nodes=(3, 7))
        assert Change.parse(sent.payload()) == sent


def test_a_change_too_big_for_a_note_crosses_as_everything_changed() -> None:
    sent = Change(origin="a1", tables=frozenset({"node"}), wake=Wake(), nodes=tuple(range(5000)))
    payload = sent.payload()
    assert len(payload.encode()) <= MAX_PAYLOAD_BYTES
    heard = Change.parse(payload)
    assert heard.everything and heard.wake.everyone and heard.origin == "a1"
