"""Server processes and what they own: a heartbeat row per process, each running
job's owner, its process tree's pids and a cancel request (jobs from any process),
and MCP tasks as every process can read them.

Revision ID: 0010
Revises: 0007
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "server_processes",
        sa.Column("process_id", sa.String(40), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("heartbeat_at", sa.Float, nullable=False),
    )
    # Jobs recorded before this revision have no owner: any process takes them for dead.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("owner_process", sa.String(40), nullable=True))
        batch.add_column(sa.Column("root_pid", sa.Integer, nullable=True))
        batch.add_column(sa.Column("supervisor_pid", sa.Integer, nullable=True))
        batch.add_column(
            sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false())
        )
    op.create_index("ix_jobs_status_owner", "jobs", ["status", "owner_process"])
    op.create_table(
        "mcp_tasks",
        sa.Column("task_id", sa.String(40), primary_key=True),
        sa.Column("sandbox_key", sa.String(128), nullable=False),
        sa.Column("tool", sa.String(64), nullable=False),
        sa.Column("owner_process", sa.String(40), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("status_message", sa.Text, nullable=True),
        sa.Column("result", sa.Text, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_mcp_tasks_owner_status", "mcp_tasks", ["owner_process", "status"])
    op.create_index("ix_mcp_tasks_finished_at", "mcp_tasks", ["finished_at"])


def downgrade() -> None:
    op.drop_table("mcp_tasks")
    op.drop_index("ix_jobs_status_owner", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cancel_requested")
        batch.drop_column("supervisor_pid")
        batch.drop_column("root_pid")
        batch.drop_column("owner_process")
    op.drop_table("server_processes")
