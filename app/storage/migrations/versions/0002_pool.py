"""The slot pool: leases and reservations, the waiting queue, one-time notes.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pool_slots",
        sa.Column("slot_index", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("sandbox_key", sa.String(128), nullable=True, unique=True),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("last_activity", sa.Float(), nullable=False),
        sa.Column("reserved_until", sa.Float(), nullable=True),
    )
    op.create_table(
        "pool_queue",
        sa.Column("sandbox_key", sa.String(128), primary_key=True),
        sa.Column("seq", sa.BigInteger(), nullable=False, unique=True),
        sa.Column("enqueued_at", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
    )
    op.create_table(
        "pool_notes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("sandbox_key", sa.String(128), nullable=False, index=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("pool_notes")
    op.drop_table("pool_queue")
    op.drop_table("pool_slots")
