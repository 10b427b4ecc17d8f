"""Asking another server process to cancel what it runs: a flag on the row.

A job (``jobs``) or an MCP task (``mcp_tasks``) runs in the process that started
it (``owner_process``). Any process may ask for its cancel by setting the row's
``cancel_requested``; the owner polls for the flags on its own running rows and
cancels them. Both stores share this one implementation.
"""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa

from app.storage.db import Store


class CancelRequests(Store):
    """``request_cancel`` and ``cancel_requests`` for the rows of ``cancel_row``.

    A subclass names the row class (with ``owner_process``, ``status`` and
    ``cancel_requested`` columns), its id column and the status of a running row.
    """

    cancel_row: ClassVar[Any]  # the ORM row class
    cancel_id: ClassVar[str]  # the name of its id column
    cancel_running: ClassVar[str]  # the status of a row still running

    async def request_cancel(self, row_id: str) -> None:
        """Ask the process running ``row_id`` to cancel it (it sees the flag on its next poll)."""
        row, id_column = self.cancel_row, getattr(self.cancel_row, self.cancel_id)
        async with self._transaction() as session:
            await session.execute(
                sa.update(row).where(id_column == row_id).values(cancel_requested=True)
            )

    async def cancel_requests(self, owner_process: str) -> list[str]:
        """Running rows of ``owner_process`` that another process asked to cancel."""
        row, id_column = self.cancel_row, getattr(self.cancel_row, self.cancel_id)
        async with self._transaction() as session:
            ids = await session.scalars(
                sa.select(id_column).where(
                    row.owner_process == owner_process,
                    row.status == self.cancel_running,
                    row.cancel_requested.is_(True),
                )
            )
            return list(ids)
