"""An in-memory ``UsageRecords`` (app/egress/meter.py): for the meter's unit
tests and the benchmark's proxy, which run without a database; the server always
passes the database's ``SqlUsageRecords`` (tested on both databases)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from app.egress.records import Notice, Usage


class MemoryUsage:
    def __init__(self) -> None:
        self._rows: dict[str, Usage] = {}
        self.days: dict[str, int] = {}  # today's bytes, by sandbox
        self.spent: set[str] = set()
        self.notices: list[Notice] = []

    async def record(
        self,
        moved: Mapping[str, int],
        refused: Mapping[str, int] | None = None,
        notices: Sequence[Notice] = (),
        *,
        max_pending: int = 20,
        sandboxes: Mapping[str, int] | None = None,
    ) -> dict[str, Usage]:
        refused = refused or {}
        for sandbox, size in (sandboxes or {}).items():
            self.days[sandbox] = self.days.get(sandbox, 0) + size
        for key in set(moved) | set(refused):
            row = self._rows.get(key, Usage(0, False))
            self._rows[key] = Usage(
                row.bytes + moved.get(key, 0), row.capped, row.refused + refused.get(key, 0)
            )
        for notice in notices:
            if sum(n.container_id == notice.container_id for n in self.notices) < max_pending:
                self.notices.append(notice)
        return {key: self._rows[key] for key in set(moved) | set(refused)}

    async def mark_capped(self, experiment_id: str, containers: Iterable[str] = ()) -> bool:
        row = self._rows.get(experiment_id, Usage(0, False))
        self._rows[experiment_id] = Usage(row.bytes, True, row.refused)
        if row.capped:
            return False
        self.notices += [Notice(c, experiment_id, "cap") for c in containers]
        return True

    async def sandbox_days(self, sandboxes: Iterable[str]) -> dict[str, int]:
        return {s: self.days[s] for s in sandboxes if s in self.days}

    async def mark_budget_spent(self, sandbox: str, containers: Iterable[str] = ()) -> bool:
        if sandbox in self.spent:
            return False
        self.spent.add(sandbox)
        self.notices += [Notice(c, "", "budget") for c in containers]
        return True

    async def load(self, experiment_ids: Iterable[str]) -> dict[str, Usage]:
        return {key: self._rows[key] for key in experiment_ids if key in self._rows}

    async def take_notices(self, container_id: str) -> list[Notice]:
        taken = [n for n in self.notices if n.container_id == container_id]
        self.notices = [n for n in self.notices if n.container_id != container_id]
        return taken
