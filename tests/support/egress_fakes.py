"""An in-memory ``UsageRecords`` (app/runtime/egress_meter.py): for the meter's unit
tests and the benchmark's proxy, which run without a database; the server always
passes the database's ``EgressUsageStore`` (tested on both databases)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from app.storage.egress_store import Usage


class MemoryUsage:
    def __init__(self) -> None:
        self._rows: dict[str, Usage] = {}

    async def add(self, moved: Mapping[str, int]) -> dict[str, Usage]:
        for key, size in moved.items():
            row = self._rows.get(key, Usage(0, False))
            self._rows[key] = Usage(row.bytes + size, row.capped)
        return {key: self._rows[key] for key in moved}

    async def mark_capped(self, experiment_id: str) -> None:
        row = self._rows.get(experiment_id, Usage(0, False))
        self._rows[experiment_id] = Usage(row.bytes, True)

    async def load(self, experiment_ids: Iterable[str]) -> dict[str, Usage]:
        return {key: self._rows[key] for key in experiment_ids if key in self._rows}
