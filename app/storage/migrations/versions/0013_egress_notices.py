"""Network "restricted" with several server processes: what the proxy refused (and
the cap reached) waits here for the experiment's next command result, whichever
process counted the log and whichever runs that command; refusals are counted per
experiment beside its bytes.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("egress_usage") as table:
        table.add_column(sa.Column("refused", sa.Integer, nullable=False, server_default="0"))
    op.create_table(
        "egress_notices",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("container_id", sa.String(80), nullable=False),
        sa.Column("experiment_id", sa.String(40), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("text", sa.String(600), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_egress_notices_container_id", "egress_notices", ["container_id"])


def downgrade() -> None:
    op.drop_index("ix_egress_notices_container_id", table_name="egress_notices")
    op.drop_table("egress_notices")
    with op.batch_alter_table("egress_usage") as table:
        table.drop_column("refused")
