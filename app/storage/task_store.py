"""MCP tasks in the database, so that every server process can answer for them.

The process serving a task keeps it in memory (``app.mcp.tasks.store``) and mirrors
it here when it opens and when it ends (``app.mcp.tasks.mirror``); another process
reads it here, and asks for its cancel here.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.mcp.tasks.store import TaskRecord
from app.storage.cancel_requests import CancelRequests
from app.storage.db import Base


class TaskRow(Base):
    __tablename__ = "mcp_tasks"

    task_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    sandbox_key: Mapped[str] = mapped_column(sa.String(128))
    tool: Mapped[str] = mapped_column(sa.String(64))
    owner_process: Mapped[str] = mapped_column(sa.String(40))
    status: Mapped[str] = mapped_column(sa.String(16))
    status_message: Mapped[str | None] = mapped_column(sa.Text)
    result: Mapped[str | None] = mapped_column(sa.Text)  # JSON: the CallToolResult sent
    error: Mapped[str | None] = mapped_column(sa.Text)  # JSON: the JSON-RPC error
    created_at: Mapped[float] = mapped_column(sa.Float)
    updated_at: Mapped[float] = mapped_column(sa.Float)
    finished_at: Mapped[float | None] = mapped_column(sa.Float)
    cancel_requested: Mapped[bool] = mapped_column(sa.Boolean, default=False)


def _loads(text: str | None) -> dict[str, Any] | None:
    return json.loads(text) if text else None


class SqlTaskRecords(CancelRequests):
    cancel_row = TaskRow
    cancel_id = "task_id"
    cancel_running = "working"

    async def add(self, record: TaskRecord, owner_process: str) -> None:
        async with self._transaction() as session:
            session.add(
                TaskRow(
                    task_id=record.task_id,
                    sandbox_key=record.sandbox_key,
                    tool=record.tool,
                    owner_process=owner_process,
                    status=record.status,
                    created_at=record.created_at,
                    updated_at=record.updated_at,
                    cancel_requested=False,
                )
            )

    async def finish(self, record: TaskRecord) -> None:
        async with self._transaction() as session:
            await session.execute(
                sa.update(TaskRow)
                .where(TaskRow.task_id == record.task_id)
                .values(
                    status=record.status,
                    status_message=record.status_message,
                    result=json.dumps(record.result) if record.result is not None else None,
                    error=json.dumps(record.error) if record.error is not None else None,
                    updated_at=record.updated_at,
                    finished_at=record.finished_at,
                )
            )

    async def get(self, sandbox_key: str, task_id: str) -> tuple[TaskRecord, str] | None:
        """The sandbox's task and the process serving it; None for another key's."""
        async with self._transaction() as session:
            row = await session.get(TaskRow, task_id)
            if row is None or row.sandbox_key != sandbox_key:
                return None
            record = TaskRecord(
                task_id=row.task_id,
                sandbox_key=row.sandbox_key,
                tool=row.tool,
                created_at=row.created_at,
                updated_at=row.updated_at,
                status=row.status,  # type: ignore[arg-type]  # written from a TaskStatus
                status_message=row.status_message,
                result=_loads(row.result),
                error=_loads(row.error),
                finished_at=row.finished_at,
            )
            return record, row.owner_process

    async def delete(self, task_id: str) -> None:
        async with self._transaction() as session:
            await session.execute(sa.delete(TaskRow).where(TaskRow.task_id == task_id))

    async def forget_finished_before(self, cutoff: float) -> int:
        async with self._transaction() as session:
            result = await session.execute(sa.delete(TaskRow).where(TaskRow.finished_at < cutoff))
            return int(getattr(result, "rowcount", 0) or 0)

    async def forget_unfinished_of(self, live_processes: set[str], at: float) -> int:
        """Tasks whose serving process died can never finish: end them as failed."""
        async with self._transaction() as session:
            result = await session.execute(
                sa.update(TaskRow)
                .where(TaskRow.status == "working", TaskRow.owner_process.not_in(live_processes))
                .values(
                    status="failed",
                    status_message=(
                        "The server process serving this task stopped; its command's job is "
                        "recorded as lost (get_experiment lists it). Call the tool again."
                    ),
                    error=json.dumps({"code": -32603, "message": "Internal error"}),
                    updated_at=at,
                    finished_at=at,
                )
            )
            return int(getattr(result, "rowcount", 0) or 0)
