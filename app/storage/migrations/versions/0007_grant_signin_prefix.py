"""Each grant remembers the address prefix it was signed in from (the live-sandbox cap).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Grants made before this revision have none: they count against no address.
    op.add_column("oauth_grants", sa.Column("signin_prefix", sa.String(64), nullable=True))
    op.create_index("ix_oauth_grants_signin_prefix", "oauth_grants", ["signin_prefix"])


def downgrade() -> None:
    op.drop_index("ix_oauth_grants_signin_prefix", table_name="oauth_grants")
    op.drop_column("oauth_grants", "signin_prefix")
