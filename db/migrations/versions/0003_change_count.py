"""The count of committed writes to each table, which lets a server on
PostgreSQL remember what it read of a table (the live nodes, for placement
and a submit's checks) until another server changes it. A new, empty
table: no row of any other table is touched.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# 64 bits, as in 0001.
INTEGER = sa.Integer().with_variant(sa.BigInteger(), "postgresql")

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "change_count",
        sa.Column("table_name", sa.String(), nullable=False),
        sa.Column("count", INTEGER, nullable=False),
        sa.PrimaryKeyConstraint("table_name"),
    )


def downgrade() -> None:
    op.drop_table("change_count")
