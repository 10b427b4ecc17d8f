"""Test summaries on jobs, and collected artifacts.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("test_summary", sa.Text(), nullable=True))
    op.create_table(
        "artifacts",
        sa.Column("artifact_id", sa.String(40), primary_key=True),
        sa.Column(
            "experiment_id",
            sa.String(40),
            sa.ForeignKey("experiments.experiment_id", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("sandbox_key", sa.String(128), nullable=False, index=True),
        sa.Column("path", sa.String(4096), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("stored_as", sa.String(200), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("artifacts")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("test_summary")
