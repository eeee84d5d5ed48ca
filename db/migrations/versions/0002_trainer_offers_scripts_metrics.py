"""What nodes offer (trainers with their params schemas, scripts with their
hashes) and any metric in progress (issue 16). Every column is new, so old
rows keep every value; a node offers the trainers it named, with no schema
(as a worker of before would say) until it registers again.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# 64 bits, as in 0001.
INTEGER = sa.Integer().with_variant(sa.BigInteger(), "postgresql")

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMNs (a constant default makes NOT NULL possible on
    # SQLite): no table is copied, so no foreign key pointing at one breaks.
    op.add_column(
        "node", sa.Column("trainer_offers", sa.JSON(), nullable=False, server_default="[]")
    )
    op.add_column("node", sa.Column("scripts", sa.JSON(), nullable=False, server_default="{}"))
    node = sa.table(
        "node",
        sa.column("id", sa.Integer()),
        sa.column("trainers", sa.JSON()),
        sa.column("trainer_offers", sa.JSON()),
    )
    bind = op.get_bind()
    for node_id, names in bind.execute(sa.select(node.c.id, node.c.trainers)).all():
        offers = [{"name": name, "version": "0", "params_schema": None} for name in names or []]
        bind.execute(node.update().where(node.c.id == node_id).values(trainer_offers=offers))
    op.add_column(
        "job",
        sa.Column("progress_step", INTEGER, nullable=True),
    )
    op.add_column(
        "job",
        sa.Column(
            "progress_epochs",
            sa.Integer().with_variant(sa.BigInteger(), "postgresql"),
            nullable=True,
        ),
    )
    op.add_column("job", sa.Column("progress_metrics", sa.JSON(), nullable=True))
    op.add_column(
        "progress",
        sa.Column("step", INTEGER, nullable=True),
    )
    op.add_column("progress", sa.Column("metrics", sa.JSON(), nullable=True))


def downgrade() -> None:
    for table, column in (
        ("progress", "metrics"),
        ("progress", "step"),
        ("job", "progress_metrics"),
        ("job", "progress_epochs"),
        ("job", "progress_step"),
        ("node", "scripts"),
        ("node", "trainer_offers"),
    ):
        op.drop_column(table, column)
