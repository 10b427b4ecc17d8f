"""How long the records of finished work are kept: without it the audit trail and the
outputs of destroyed experiments (up to 2 MB a job) grow for ever.

Kept for ``keep_s`` after they end: tool-call rows, and destroyed experiments with
their transitions and jobs (an experiment still holding an artifact is kept until the
artifact expires, so no file on the shelf loses its row), then their egress usage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from app.storage.db import Repository
from app.storage.egress_store import SqlUsageRecords
from app.storage.experiment_store import SqlExperimentStore

log = structlog.get_logger(__name__)


@dataclass
class Retention:
    repository: Repository
    records: SqlExperimentStore
    egress: SqlUsageRecords
    keep_s: float
    clock: Callable[[], float] = field(default=time.time)
    # The watchdog calls every few seconds; the deletes scan the audit trail, so they
    # run once an interval, not on every call.
    every_s: float = 3600.0
    _next_at: float = field(default=0.0, init=False)

    async def sweep(self) -> None:
        """A watchdog chore: at most once every ``every_s``, forget what ended more than
        ``keep_s`` ago."""
        now = self.clock()
        if now < self._next_at:
            return
        self._next_at = now + self.every_s
        cutoff = now - self.keep_s
        calls = await self.repository.forget_tool_calls_before(cutoff)
        experiments = await self.records.forget_destroyed_before(cutoff)
        egress = await self.egress.forget_before(cutoff)  # after: theirs go too
        # The daily counts of stored job output (a day's matters on that day only).
        days = await self.records.forget_output_days_before(cutoff)
        if calls or experiments or egress or days:
            log.info(
                "retention.swept",
                tool_calls=calls,
                experiments=experiments,
                egress=egress,
                output_days=days,
            )
