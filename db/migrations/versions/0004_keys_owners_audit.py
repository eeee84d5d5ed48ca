"""People (issue 18): per-person API keys, the owner of each job and study,
and the audit log. New tables and nullable columns only: every row of
before is kept, and its jobs have no owner (any writer may act on them, as
before owners existed).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# 64 bits, as in 0001.
INTEGER = sa.Integer().with_variant(sa.BigInteger(), "postgresql")

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_key",
        sa.Column("id", INTEGER, nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("role", sa.String(), nullable=False),
        sa.Column("digest", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("created_by", sa.String(), nullable=True),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.Column("revoked_by", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
        sa.UniqueConstraint("digest"),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", INTEGER, nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("actor", sa.String(), nullable=True),
        sa.Column("role", sa.String(), nullable=True),
        sa.Column("address", sa.String(), nullable=True),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("target", sa.String(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_actor", "audit_log", ["actor"])
    for table in ("job", "study"):
        op.add_column(table, sa.Column("owner", sa.String(), nullable=True))
        op.create_index(f"ix_{table}_owner", table, ["owner"])


def downgrade() -> None:
    for table in ("study", "job"):
        op.drop_index(f"ix_{table}_owner", table_name=table)
        op.drop_column(table, "owner")
    op.drop_table("audit_log")
    op.drop_table("api_key")
