"""Audit rows that stand for several calls: a sandbox's repeated refusals are counted
and written as one row a minute (issue 23); ``calls`` says how many it stands for.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tool_calls") as table:
        table.add_column(sa.Column("calls", sa.Integer, nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("tool_calls") as table:
        table.drop_column("calls")
