"""What an experiment's creation put in its workspace (files copied, secret-shaped
files left out), kept on its record for an agent whose create went on in the
background; and the server process that created it, so recovery retires one left
CREATING by a process that died (issue 25, long creates).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as table:
        table.add_column(sa.Column("files_copied", sa.Integer, nullable=True))
        table.add_column(sa.Column("secrets_skipped", sa.Integer, nullable=True))
        table.add_column(sa.Column("creator_process", sa.String(40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as table:
        table.drop_column("creator_process")
        table.drop_column("secrets_skipped")
        table.drop_column("files_copied")
