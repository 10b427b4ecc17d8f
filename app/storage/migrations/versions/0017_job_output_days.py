"""Each sandbox's stored job bytes of the day, for its daily budget of job output
(issue 23: one sandbox's output must not fill the database's disk), and the flag of
a job whose output went past it (only its tails kept).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_output_days",
        sa.Column("sandbox_key", sa.String(128), primary_key=True),
        sa.Column("day", sa.Integer, primary_key=True),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("kept", sa.Boolean, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    with op.batch_alter_table("jobs") as table:
        table.add_column(
            sa.Column("output_not_kept", sa.Boolean, nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as table:
        table.drop_column("output_not_kept")
    op.drop_table("job_output_days")
