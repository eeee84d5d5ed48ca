"""Checkpoints' SHA-256 and MLflow runs (issue 32): each reader of a job's
kept checkpoint (a retry's node from the artifact store or the server, a
user's download) checks what it read against the digest its writer
computed; a job keeps the id of its MLflow run. Nullable columns only:
checkpoints kept before have no digest and are read unchecked.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("checkpoint_sha256", sa.String(), nullable=True))
        batch.add_column(sa.Column("mlflow_run_id", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("mlflow_run_id")
        batch.drop_column("checkpoint_sha256")
