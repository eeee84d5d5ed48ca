"""The schema of commit 74ed8f8, the first one migrations know: a database
made before there were migrations has it (nothing changed the tables from
then until 0002).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# 64-bit everywhere: PostgreSQL's INTEGER is 32 bits (no PostgreSQL database
# predates this revision, so its base already has BIGINT there).
INTEGER = sa.Integer().with_variant(sa.BigInteger(), "postgresql")

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node",
        sa.Column("id", INTEGER, nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("address", sa.String(), nullable=False),
        sa.Column("slots", INTEGER, nullable=False),
        sa.Column("gpus", INTEGER, nullable=False),
        sa.Column("cpus", INTEGER, nullable=False),
        sa.Column("trainers", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("credential_digest", sa.String(), nullable=True),
        sa.Column("registered_at", sa.DateTime(), nullable=False),
        sa.Column("last_heartbeat_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("credential_digest"),
    )
    op.create_index("ix_node_state", "node", ["state"])
    op.create_index("ix_node_name", "node", ["name"], unique=True)
    op.create_table(
        "study",
        sa.Column("id", INTEGER, nullable=False),
        sa.Column("name", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "job",
        sa.Column("id", INTEGER, nullable=False),
        sa.Column("name", sa.String(), nullable=True),
        sa.Column("study_id", INTEGER, nullable=True),
        sa.Column("study_index", INTEGER, nullable=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("idempotency_key", sa.String(), nullable=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("priority", INTEGER, nullable=False),
        sa.Column("pending_reason", sa.String(), nullable=True),
        sa.Column("current_attempt_id", INTEGER, nullable=True),
        sa.Column("attempt_count", INTEGER, nullable=False),
        sa.Column("not_before", sa.DateTime(), nullable=True),
        sa.Column("deadline_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("progress_seq", INTEGER, nullable=True),
        sa.Column("progress_epoch", INTEGER, nullable=True),
        sa.Column("progress_batch", INTEGER, nullable=True),
        sa.Column("progress_batches_per_epoch", INTEGER, nullable=True),
        sa.Column("progress_loss", sa.Float(), nullable=True),
        sa.Column("progress_samples_per_sec", sa.Float(), nullable=True),
        sa.Column("progress_at", sa.DateTime(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("checkpoint_epoch", INTEGER, nullable=True),
        sa.Column("checkpoint_file", sa.String(), nullable=True),
        sa.Column("checkpoint_bytes", INTEGER, nullable=True),
        sa.ForeignKeyConstraint(["study_id"], ["study.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("idempotency_key"),
    )
    op.create_index("ix_job_status", "job", ["status"])
    op.create_index("ix_job_created_at", "job", ["created_at"])
    op.create_index("ix_job_study_id", "job", ["study_id"])
    op.create_index("ix_job_deadline_at", "job", ["deadline_at"])
    op.create_table(
        "attempt",
        sa.Column("id", INTEGER, nullable=False),
        sa.Column("job_id", INTEGER, nullable=False),
        sa.Column("number", INTEGER, nullable=False),
        sa.Column("master_addr", sa.String(), nullable=False),
        sa.Column("master_port", INTEGER, nullable=True),
        sa.Column("resumed_from_epoch", INTEGER, nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_attempt_job_id", "attempt", ["job_id"])
    op.create_table(
        "part",
        sa.Column("id", INTEGER, nullable=False),
        sa.Column("job_id", INTEGER, nullable=False),
        sa.Column("attempt_id", INTEGER, nullable=False),
        sa.Column("machine_id", INTEGER, nullable=False),
        sa.Column("node_id", INTEGER, nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("assigned_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("exit_code", INTEGER, nullable=True),
        sa.Column("failing_rank", INTEGER, nullable=True),
        sa.Column("error", sa.String(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"]),
        sa.ForeignKeyConstraint(["node_id"], ["node.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "machine_id"),
        sa.UniqueConstraint("attempt_id", "node_id"),
    )
    op.create_index("ix_part_status", "part", ["status"])
    op.create_index("ix_part_job_id", "part", ["job_id"])
    op.create_index("ix_part_attempt_id", "part", ["attempt_id"])
    op.create_index("ix_part_node_id", "part", ["node_id"])
    op.create_table(
        "progress",
        sa.Column("id", INTEGER, nullable=False),
        sa.Column("job_id", INTEGER, nullable=False),
        sa.Column("attempt_id", INTEGER, nullable=False),
        sa.Column("seq", INTEGER, nullable=False),
        sa.Column("epoch", INTEGER, nullable=False),
        sa.Column("batch", INTEGER, nullable=False),
        sa.Column("batches_per_epoch", INTEGER, nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("samples_per_sec", sa.Float(), nullable=True),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "seq"),
    )
    op.create_index("ix_progress_job_id", "progress", ["job_id"])
    op.create_table(
        "log_line",
        sa.Column("id", INTEGER, nullable=False),
        sa.Column("job_id", INTEGER, nullable=False),
        sa.Column("attempt_id", INTEGER, nullable=False),
        sa.Column("machine_id", INTEGER, nullable=False),
        sa.Column("rank", INTEGER, nullable=False),
        sa.Column("offset", INTEGER, nullable=False),
        sa.Column("text", sa.String(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "machine_id", "rank", "offset"),
    )
    op.create_index("ix_log_line_job_id", "log_line", ["job_id"])


def downgrade() -> None:
    for table in ("log_line", "progress", "part", "attempt", "job", "study", "node"):
        op.drop_table(table)
