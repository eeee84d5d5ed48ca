"""PostgreSQL: a node's "started" report and the nodes' heartbeat times are
written beside the one writer (db/engine.py, ``Database.write(exclusive=False)``):
they are not held up by a long write on any server, a cancel that comes
meanwhile still stops the part, and a node's row held by a write leaves its
heartbeat time for the next turn rather than keeping anyone waiting. (SQLite
has one writer: every write waits its turn there.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from api.core.clock import write_sightings
from db.engine import WRITE_LOCK_KEY
from tests.api.conftest import ProtocolNode, ThreadedServer, wait_for
from tests.api.test_jobs_api import submit
from tests.databases import on_postgres

pytestmark = pytest.mark.skipif(
    not on_postgres(), reason="the write lock across servers is PostgreSQL's (CI's PostgreSQL lane)"
)


@contextmanager
def another_connection(server: ThreadedServer) -> Iterator[psycopg.Connection]:
    """A connection of its own to the server's database, as another server's."""
    url = make_url(server.settings.database_url).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as other:
        yield other


def heartbeat_at(other: psycopg.Connection, node_id: int) -> datetime:
    row = other.execute("SELECT last_heartbeat_at FROM node WHERE id = %s", (node_id,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_a_started_report_is_not_held_up_by_a_long_write_and_a_cancel_meanwhile_still_stops_it(
    client: httpx.Client, server: ThreadedServer
) -> None:
    node = ProtocolNode(client, "n1")
    job = submit(client, name="raced")
    (assignment,) = node.poll()["start"]
    part_id = assignment["part_id"]
    with another_connection(server) as other:
        # Another server's write, holding the write lock for as long as it takes.
        other.execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK_KEY,))
        cancelled: list[httpx.Response] = []
        cancel = threading.Thread(
            target=lambda: cancelled.append(client.post(f"/jobs/{job['id']}/cancel"))
        )
        cancel.start()  # waits for the lock
        started = client.post(f"/parts/{part_id}/started", json={"node_id": node.node_id})
        assert started.status_code == 200, started.text
        assert not cancelled, "the cancel was written while another write held the lock"
        other.execute("SELECT pg_advisory_unlock(%s)", (WRITE_LOCK_KEY,))
    cancel.join(10)
    assert cancelled and cancelled[0].status_code == 200, cancelled
    wait_for(
        lambda: node.poll([part_id])["stop"] == [part_id],
        what="the node to be told to stop the part it started",
    )
    node.finish(part_id, "cancelled").raise_for_status()
    wait_for(
        lambda: client.get(f"/jobs/{job['id']}").json()["status"] == "cancelled",
        what="the job to end cancelled",
    )


def test_the_nodes_heard_reach_the_database_while_another_server_holds_the_write_lock(
    client: httpx.Client, server: ThreadedServer
) -> None:
    node = ProtocolNode(client, "n1")
    with another_connection(server) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK_KEY,))
        before = heartbeat_at(other, node.node_id)
        node.poll()  # heard: written at the server's next sweep interval
        wait_for(
            lambda: heartbeat_at(other, node.node_id) > before,
            what="the node's heartbeat time written while the write lock is held",
        )
        other.execute("SELECT pg_advisory_unlock(%s)", (WRITE_LOCK_KEY,))


def test_a_nodes_row_held_by_a_write_leaves_its_heartbeat_time_for_the_next_turn(
    client: httpx.Client, server: ThreadedServer
) -> None:
    node = ProtocolNode(client, "n1")
    core = server.app_core()
    with another_connection(server) as other:
        with other.transaction():
            # A write holding the node's row (its state changing, say).
            other.execute("SELECT id FROM node WHERE id = %s FOR UPDATE", (node.node_id,))
            before = heartbeat_at(other, node.node_id)  # no other write can move it now
            node.poll()
            # This test's turns, beside the server's own: each gives up on
            # the row (waiting for it would be for ever, as this transaction
            # holds it until they end).
            turns = threading.Thread(target=lambda: [write_sightings(core) for _ in range(3)])
            turns.start()
            wait_for(lambda: not turns.is_alive(), what="three turns giving up on the held row")
            assert heartbeat_at(other, node.node_id) == before
        # The write ended: the sighting kept for a later turn is written,
        # with no request from the node since.
        wait_for(
            lambda: heartbeat_at(other, node.node_id) > before,
            what="the node's heartbeat time written once its row was let go",
        )
