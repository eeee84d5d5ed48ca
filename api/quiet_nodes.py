"""Nodes whose last poll was answered "nothing to start, stop or wait
for", remembered until news for them: their next polls and heartbeats are
answered from memory, without a database read or a thread.

Most of a large cluster's nodes are idle or busy with a part they already
run, asking every few seconds whether anything changed. Every write that
changes a node's answer wakes it (api/main.py, _wakes_polls; other
servers' writes too, through their notes, db/changes.py), and a wake moves
the node's stamp (api/notifier.py), which forgets the remembered answer.
The stamp is taken before the database is read, so a write that commits
during the read forgets the answer it may have missed.

Only answers for nodes waiting for no rendezvous port are remembered (a
port becoming known wakes polls, not a node). Used from the event loop
only.
"""

from __future__ import annotations

from api.notifier import Notifier


class QuietNodes:
    def __init__(self, notifier: Notifier) -> None:
        self._notifier = notifier
        self._quiet: dict[int, tuple[tuple[int, int], frozenset[int]]] = {}

    def stamp(self, node_id: int) -> tuple[int, int]:
        return self._notifier.stamp(node_id)

    def heard_nothing(self, node_id: int, stamp: tuple[int, int], running: list[int]) -> None:
        """A poll taken at ``stamp``, reporting ``running``, had nothing for the node."""
        self._quiet[node_id] = (stamp, frozenset(running))

    def still_quiet(self, node_id: int, running: list[int]) -> bool:
        """Whether a node reporting ``running`` would hear nothing again."""
        quiet = self._quiet.get(node_id)
        if quiet is None:
            return False
        stamp, reported = quiet
        if stamp != self._notifier.stamp(node_id):
            del self._quiet[node_id]
            return False
        return reported == frozenset(running)
