"""The day's audit rows reserved per sandbox and per sign-in address, shared by every
server process on the database: the daily bound on a sandbox's audit rows holds
however many processes serve it (issue 23).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_days",
        sa.Column("owner", sa.String(200), primary_key=True),
        sa.Column("day", sa.Integer, primary_key=True),
        sa.Column("granted", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("audit_days")
