"""Upgrades that keep the data: a database with the base revision's schema
(commit 74ed8f8's, before migrations) and rows in every table is refused by
the server with the command that upgrades it; upgraded, the API reads every
row back, and the node's credential still works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, text
from sqlmodel import SQLModel

from api.credentials import digest
from cli.cluster import free_port
from db import migrate
from db.engine import Database
from tests.api.conftest import ThreadedServer, bearer, make_settings
from tests.conftest import REPO
from tests.databases import fresh_database_url

CREDENTIAL = "ddpo-node-" + "k" * 43
# What commit 74ed8f8 stored as a job's spec.
OLD_SPEC: dict[str, Any] = {
    "name": "before-the-upgrade",
    "trainer": "mnist",
    "topology": {"num_machines": 1, "num_processes": 2},
    "backend": "gloo",
    "batch_size": 64,
    "epochs": 2,
    "lr": 0.5,
    "seed": 0,
    "max_steps_per_epoch": 5,
    "performance": {
        "data_pipeline": "tensor",
        "threads_per_process": None,
        "channels_last": True,
        "pool_before_relu": True,
        "dropout_masks": "uniform",
        "keep_freed_memory": True,
        "start_method": "fork",
        "same_host_allreduce": "shared_memory",
        "gradient_as_bucket_view": False,
        "bucket_cap_mb": 25.0,
    },
    "max_restarts": 1,
    "max_run_seconds": None,
}
AT = datetime(2026, 11, 30, 12, 0, 0)  # UTC, stored without a zone as 74ed8f8 did
CHECKPOINT = b"the bytes of epoch 2"


def old_rows(url: str) -> None:
    """A row in every table, as commit 74ed8f8 would have written them: one
    node, a study with a job that failed once and then succeeded."""
    engine = create_engine(url)
    spec, result = json.dumps(OLD_SPEC), json.dumps({"train_loss": 0.5, "test_accuracy": 0.9})
    error = json.dumps({"reason": "rank_exited", "message": "rank 1 was killed by SIGKILL"})
    with engine.begin() as db:
        db.execute(
            text(
                "INSERT INTO node (id, name, address, slots, gpus, cpus, trainers, state, "
                "credential_digest, registered_at, last_heartbeat_at) VALUES (1, 'old-node', "
                "'10.0.0.5', 2, 0, 8, '[\"mnist\"]', 'live', :digest, :at, :at)"
            ),
            {"digest": digest(CREDENTIAL), "at": AT},
        )
        db.execute(
            text("INSERT INTO study (id, name, created_at) VALUES (1, 'old-study', :at)"),
            {"at": AT},
        )
        db.execute(
            text(
                "INSERT INTO job (id, name, study_id, study_index, spec, status, priority, "
                "current_attempt_id, attempt_count, created_at, started_at, finished_at, "
                "progress_seq, progress_epoch, progress_batch, progress_batches_per_epoch, "
                "progress_loss, progress_samples_per_sec, progress_at, result, "
                "checkpoint_epoch, checkpoint_file, checkpoint_bytes) VALUES (1, "
                "'before-the-upgrade', 1, 0, :spec, 'succeeded', 0, 2, 2, :at, :at, :at, 1, 2, "
                "5, 5, 0.5, 1000.0, :at, :result, 2, 'epoch-2.pt', :size)"
            ),
            {"spec": spec, "at": AT, "result": result, "size": len(CHECKPOINT)},
        )
        for number, outcome in ((1, error), (2, None)):
            db.execute(
                text(
                    "INSERT INTO attempt (id, job_id, number, master_addr, master_port, "
                    "resumed_from_epoch, created_at, finished_at, error) VALUES "
                    "(:n, 1, :n, '10.0.0.5', 29400, :resumed, :at, :at, :error)"
                ),
                {"n": number, "resumed": 1 if number == 2 else None, "at": AT, "error": outcome},
            )
            db.execute(
                text(
                    "INSERT INTO part (id, job_id, attempt_id, machine_id, node_id, status, "
                    "assigned_at, started_at, finished_at, exit_code) VALUES "
                    "(:n, 1, :n, 0, 1, :status, :at, :at, :at, :code)"
                ),
                {
                    "n": number,
                    "status": "failed" if outcome else "succeeded",
                    "at": AT,
                    "code": -9 if outcome else 0,
                },
            )
        for seq, loss in ((0, 0.7), (1, 0.5)):
            db.execute(
                text(
                    "INSERT INTO progress (job_id, attempt_id, seq, epoch, batch, "
                    "batches_per_epoch, loss, samples_per_sec, at) VALUES "
                    "(1, 2, :seq, 2, :batch, 5, :loss, 1000.0, :at)"
                ),
                {"seq": seq, "batch": 3 + 2 * seq, "loss": loss, "at": AT},
            )
        db.execute(
            text(
                'INSERT INTO log_line (job_id, attempt_id, machine_id, rank, "offset", text, at) '
                "VALUES (1, 2, 0, 0, 0, 'Train Epoch: 2', :at)"
            ),
            {"at": AT},
        )
        if engine.dialect.name == "postgresql":
            # Rows inserted with their ids leave the id sequences behind.
            for table in ("node", "study", "job", "attempt", "part", "progress", "log_line"):
                db.execute(
                    text(
                        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                        f"(SELECT MAX(id) FROM {table}))"
                    )
                )
    engine.dispose()


def test_the_migrations_make_exactly_the_tables_a_new_database_gets(tmp_path: Path) -> None:
    """A new database is made from the models and stamped with the newest
    revision; the migrations, run from empty, make the very same schema."""
    assert migrate.head() == migrate.HEAD
    migrated = Database(fresh_database_url(tmp_path, "migrated"))
    assert migrate.upgrade(migrated.engine) == (None, migrate.HEAD)
    made = Database(fresh_database_url(tmp_path, "made"))
    made.prepare_schema()
    for database in (migrated, made):
        assert migrate.current(database.engine) == migrate.HEAD
        with database.engine.connect() as connection:
            context = MigrationContext.configure(connection)
            assert compare_metadata(context, SQLModel.metadata) == []
            assert context.get_current_revision() == migrate.HEAD  # Alembic reads it too
        database.prepare_schema()  # at its revision: used as it is
        database.dispose()


def server_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "api", *args],
        cwd=REPO,
        env={**os.environ, "DDPO_NO_AUTH": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.timeout(120)
def test_an_older_schema_is_refused_then_upgraded_with_every_row_kept(tmp_path: Path) -> None:
    url = fresh_database_url(tmp_path, "old")
    engine = create_engine(url)
    migrate.upgrade(engine, to=migrate.BASE)
    with engine.begin() as db:
        db.execute(text("DROP TABLE alembic_version"))  # as made before migrations existed
    engine.dispose()
    old_rows(url)
    artifacts = tmp_path / "artifacts"
    (artifacts / "job-1").mkdir(parents=True)
    (artifacts / "job-1" / "epoch-2.pt").write_bytes(CHECKPOINT)

    refused = server_command("--database-url", url, "--port", str(free_port()))
    assert refused.returncode == 2, refused.stderr
    assert "is at revision 0001 and this release needs" in refused.stderr
    assert "run `ddpo-server db upgrade`" in refused.stderr
    assert server_command("db", "current", "--database-url", url).stdout.startswith("0001 ")

    upgraded = server_command("db", "upgrade", "--database-url", url)
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"upgraded from 0001 to revision {migrate.head()}" in upgraded.stdout

    settings = make_settings(tmp_path, artifacts_dir=artifacts)
    settings = settings.model_copy(update={"database_url": url})
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url) as client:
        job = client.get("/jobs/1").raise_for_status().json()
        assert job["name"] == "before-the-upgrade" and job["status"] == "succeeded"
        assert job["spec"]["topology"] == {"num_machines": 1, "num_processes": 2}
        assert job["spec"]["params"] == {} and job["spec"]["script"] is None
        assert [a["number"] for a in job["attempts"]] == [1, 2]
        assert job["attempts"][0]["error"]["reason"] == "rank_exited"
        assert job["attempts"][1]["resumed_from_epoch"] == 1
        assert [(p["node_name"], p["status"]) for p in job["parts"]] == [("old-node", "succeeded")]
        assert job["progress"]["epoch"] == 2 and job["progress"]["loss"] == 0.5
        assert job["progress"]["metrics"] == {}
        assert job["result"]["test_accuracy"] == 0.9
        assert job["checkpoint"]["epoch"] == 2
        assert job["timing"]["created_at"].startswith("2026-11-30T12:00:00")

        points = client.get("/jobs/1/metrics").json()["points"]
        assert [(p["step"], p["loss"]) for p in points] == [(8, 0.7), (10, 0.5)]
        lines = client.get("/jobs/1/logs").json()["lines"]
        assert [line["text"] for line in lines] == ["Train Epoch: 2"]
        assert client.get("/jobs/1/model").content == CHECKPOINT
        study = client.get("/studies/1").json()
        assert study["name"] == "old-study" and len(study["rows"]) == 1

        # The node's credential outlived the upgrade; it offers what it named.
        beat = client.post(
            "/nodes/1/heartbeat", json={"active_part_ids": []}, headers=bearer(CREDENTIAL)
        )
        assert beat.status_code == 200, beat.text
        (node,) = client.get("/nodes").json()["data"]
        assert (node["name"], node["trainers"], node["slots"]) == ("old-node", ["mnist"], 2)
        (mnist,) = client.get("/trainers").json()["trainers"]
        assert (mnist["name"], mnist["nodes"], mnist["params_schema"]) == (
            "mnist",
            ["old-node"],
            None,
        )
        # And new jobs are taken as before.
        assert client.post("/jobs", json={"max_steps_per_epoch": 5}).status_code == 201
