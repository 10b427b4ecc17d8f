"""Sign-in across processes: issued codes known by hash only, and shared rate budgets.

``oauth_codes`` holds, per authorization code handed out, the keyed hash of
its random id, the address prefix it was signed in from, when it was made and
expires, and the grant its redemption created: enough for single use (a second
redemption finds the grant and revokes it) and for the admission caps on every
process, never enough to redeem the code (the client carries it, sealed).
``rate_events`` is a sliding-window log for budgets every process shares.

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "oauth_codes",
        sa.Column("code_hash", sa.String(64), primary_key=True),
        sa.Column("signin_prefix", sa.String(64), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("grant_id", sa.String(64), nullable=True),
    )
    op.create_index("ix_oauth_codes_signin_prefix", "oauth_codes", ["signin_prefix"])
    op.create_index("ix_oauth_codes_created_at", "oauth_codes", ["created_at"])
    op.create_table(
        "rate_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("bucket", sa.String(128), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )
    op.create_index("ix_rate_events_bucket_at", "rate_events", ["bucket", "at"])


def downgrade() -> None:
    op.drop_index("ix_rate_events_bucket_at", table_name="rate_events")
    op.drop_table("rate_events")
    op.drop_index("ix_oauth_codes_created_at", table_name="oauth_codes")
    op.drop_index("ix_oauth_codes_signin_prefix", table_name="oauth_codes")
    op.drop_table("oauth_codes")
