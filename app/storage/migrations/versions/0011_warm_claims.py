"""Warm containers with several server processes: one row per slot that holds one.

The row is the slot's claim: a process places a warm container only in a slot it
inserted the row for (the primary key refuses a second), and the one who deletes
the row is the one who hands the container over or removes it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "warm_claims",
        sa.Column("slot", sa.String(64), primary_key=True),
        sa.Column("process_id", sa.String(40), nullable=False),
        sa.Column("root", sa.String(1024), nullable=False),
        sa.Column("container_id", sa.String(80), nullable=True),
        sa.Column("claimed_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("warm_claims")
