"""PostgreSQL: a node's "started" report is written beside the one writer
(db/engine.py, ``Database.write(exclusive=False)``): it is not held up by
a long write on any server, and a cancel that comes meanwhile still stops
the part. (SQLite has one writer: every write waits its turn there.)"""

from __future__ import annotations

import threading

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from db.engine import WRITE_LOCK_KEY
from tests.api.conftest import ProtocolNode, ThreadedServer, wait_for
from tests.api.test_jobs_api import submit
from tests.databases import on_postgres

pytestmark = pytest.mark.skipif(
    not on_postgres(), reason="the write lock across servers is PostgreSQL's (CI's PostgreSQL lane)"
)


def test_a_started_report_is_not_held_up_by_a_long_write_and_a_cancel_meanwhile_still_stops_it(
    client: httpx.Client, server: ThreadedServer
) -> None:
    node = ProtocolNode(client, "n1")
    job = submit(client, name="raced")
    (assignment,) = node.poll()["start"]
    part_id = assignment["part_id"]
    url = make_url(server.settings.database_url).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as other:
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
