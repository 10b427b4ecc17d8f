"""Client IDs up to 512 characters: a metadata document's URL is its client ID.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # SQLite does not enforce VARCHAR lengths; rebuilding its tables would gain nothing.
    if op.get_bind().dialect.name == "sqlite":
        return
    op.alter_column("oauth_clients", "client_id", type_=sa.String(512))
    op.alter_column("oauth_grants", "client_id", type_=sa.String(512))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    op.alter_column("oauth_grants", "client_id", type_=sa.String(64))
    op.alter_column("oauth_clients", "client_id", type_=sa.String(64))
