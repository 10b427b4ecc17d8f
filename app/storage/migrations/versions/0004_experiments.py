"""Experiments, their state transitions, and every command (job) run in them.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("experiment_id", sa.String(40), primary_key=True),
        sa.Column("sandbox_key", sa.String(128), nullable=False, index=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("goal", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("image", sa.String(200), nullable=False),
        sa.Column("container_id", sa.String(80), nullable=True),
        sa.Column("isolation", sa.Text(), nullable=False),  # JSON
        sa.Column("warnings", sa.Text(), nullable=False),  # JSON list
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("findings", sa.Text(), nullable=True),  # JSON, recorded before teardown
    )
    op.create_table(
        "experiment_transitions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "experiment_id",
            sa.String(40),
            sa.ForeignKey("experiments.experiment_id", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.String(40), primary_key=True),
        sa.Column(
            "experiment_id",
            sa.String(40),
            sa.ForeignKey("experiments.experiment_id", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("sandbox_key", sa.String(128), nullable=False, index=True),
        sa.Column("kind", sa.String(16), nullable=False),  # setup | command | tests
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("background", sa.Boolean(), nullable=False),
        sa.Column("timeout_s", sa.Float(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("stdout", sa.Text(), nullable=True),
        sa.Column("stderr", sa.Text(), nullable=True),
        sa.Column("stdout_truncated", sa.Boolean(), nullable=False),
        sa.Column("stderr_truncated", sa.Boolean(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("jobs")
    op.drop_table("experiment_transitions")
    op.drop_table("experiments")
