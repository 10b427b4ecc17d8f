"""Egress bytes per experiment (network "restricted"), kept across restarts and
shared by every server process, and whether its byte cap stopped it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "egress_usage",
        sa.Column("experiment_id", sa.String(40), primary_key=True),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("capped", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("egress_usage")
