"""Network "restricted": each sandbox's egress bytes of the day, for its daily budget
beside the per-experiment cap (a sandbox that makes new experiments is still bounded).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "egress_sandbox_days",
        sa.Column("sandbox", sa.String(40), primary_key=True),
        sa.Column("day", sa.Integer, primary_key=True),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("told", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("egress_sandbox_days")
