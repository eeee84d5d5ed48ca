"""Sweeps (issue 30): a sweep, its trials (each names its job and keeps
what the search needs of it), and the sweep a job is a trial of. New tables
and a nullable column only: every row of before is kept.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# 64 bits, as in 0001.
INTEGER = sa.Integer().with_variant(sa.BigInteger(), "postgresql")

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweep",
        sa.Column("id", INTEGER, nullable=False),
        sa.Column("name", sa.String(), nullable=True),
        sa.Column("owner", sa.String(), nullable=True),
        sa.Column("create", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("error", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_sweep_owner", "sweep", ["owner"])
    op.create_index("ix_sweep_status", "sweep", ["status"])
    op.create_table(
        "trial",
        sa.Column("id", INTEGER, nullable=False),
        sa.Column("sweep_id", INTEGER, nullable=False),
        sa.Column("number", INTEGER, nullable=False),
        sa.Column("job_id", INTEGER, nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("reports", sa.JSON(), nullable=False),
        sa.Column("system_attrs", sa.JSON(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("pruned_at_step", INTEGER, nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweep.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sweep_id", "number"),
        sa.UniqueConstraint("job_id"),
    )
    op.create_index("ix_trial_sweep_id", "trial", ["sweep_id"])
    op.add_column("job", sa.Column("sweep_id", INTEGER, nullable=True))
    op.create_index("ix_job_sweep_id", "job", ["sweep_id"])


def downgrade() -> None:
    op.drop_index("ix_job_sweep_id", table_name="job")
    with op.batch_alter_table("job") as batch:
        batch.drop_column("sweep_id")
    op.drop_index("ix_trial_sweep_id", table_name="trial")
    op.drop_table("trial")
    op.drop_index("ix_sweep_status", table_name="sweep")
    op.drop_index("ix_sweep_owner", table_name="sweep")
    op.drop_table("sweep")
