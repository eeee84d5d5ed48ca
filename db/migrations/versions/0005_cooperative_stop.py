"""The cooperative stop (issue 28): an attempt the server asked to stop at
a step says why, for whom and by when, and the step it stopped at; a job
keeps the step of its stop checkpoint and how many attempts ended on
request (they use no restart); a node being drained says why and by when.
Nullable columns and one with a default only: every row of before is kept
as it was.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# 64 bits, as in 0001.
INTEGER = sa.Integer().with_variant(sa.BigInteger(), "postgresql")

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

ATTEMPT_COLUMNS = (
    ("num_machines", INTEGER),
    ("resumed_from_step", INTEGER),
    ("stop_reason", sa.String()),
    ("stop_detail", sa.String()),
    ("stop_requested_at", sa.DateTime()),
    ("stop_deadline_at", sa.DateTime()),
    ("stopped_at_step", INTEGER),
)

NODE_COLUMNS = (
    ("drain_reason", sa.String()),
    ("drain_requested_at", sa.DateTime()),
    ("drain_deadline_at", sa.DateTime()),
)


def upgrade() -> None:
    with op.batch_alter_table("attempt") as batch:
        for name, type_ in ATTEMPT_COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))
    op.create_index("ix_attempt_stop_deadline_at", "attempt", ["stop_deadline_at"])
    with op.batch_alter_table("node") as batch:
        for name, type_ in NODE_COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("checkpoint_step", INTEGER, nullable=True))
        batch.add_column(sa.Column("stopped_attempts", INTEGER, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("stopped_attempts")
        batch.drop_column("checkpoint_step")
    with op.batch_alter_table("node") as batch:
        for name, _ in reversed(NODE_COLUMNS):
            batch.drop_column(name)
    op.drop_index("ix_attempt_stop_deadline_at", table_name="attempt")
    with op.batch_alter_table("attempt") as batch:
        for name, _ in reversed(ATTEMPT_COLUMNS):
            batch.drop_column(name)
