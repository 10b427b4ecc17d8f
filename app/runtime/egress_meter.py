"""The per-experiment egress byte cap, kept durable and enforced during a transfer.

* **Durable.** Bytes come from Squid's access log (both ways, once a transfer ends)
  and are added to the experiment's row in the database
  (:class:`app.storage.egress_store.EgressUsageStore`): a restart of the server,
  or another process of ``serve --workers``, continues from the same total.
* **During a transfer.** Every poll (:data:`POLL_S`) the bytes of the connections
  still open (the kernel's count, :mod:`app.runtime.egress_sockets`) are added to
  the recorded total; once the cap is reached the experiment is blocked (the ACL
  helper refuses it), its open connections are cut (``ss -K``), ``capped`` is
  recorded, and its next command result says so (``EGRESS_CAP_REACHED``).
* **The residual overrun** is what the experiment moves between two polls (one
  second of its transfers) and what the socket buffers held when it was cut; a
  server killed with ``kill -9`` also loses the bytes of its last poll.

The log is read and parsed in a thread (a big log never holds the event loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Final, Protocol

import structlog

from app.errors import DatabaseUnavailable
from app.runtime.egress_sockets import cut, live_bytes
from app.runtime.egress_usage import Ledger, read_new_lines
from app.storage.egress_store import Usage

log = structlog.get_logger(__name__)

POLL_S: Final = 1.0


class UsageRecords(Protocol):
    """Where each experiment's bytes are kept (the database: ``EgressUsageStore``)."""

    async def add(self, moved: Mapping[str, int]) -> dict[str, Usage]: ...
    async def mark_capped(self, experiment_id: str) -> None: ...
    async def load(self, experiment_ids: Iterable[str]) -> dict[str, Usage]: ...


class EgressMeter:
    """Counts one Squid's log into ``records`` and stops experiments at the cap."""

    def __init__(
        self,
        ledger: Ledger,
        records: UsageRecords,
        *,
        write_state: Callable[[], None],
    ) -> None:
        self._ledger = ledger
        self._records = records
        self._write_state = write_state  # blocking: the ACL helper's state file
        self._log: Path | None = None
        self._proxy: tuple[str, int] | None = None
        self._offset = 0
        self._unrecorded: dict[str, int] = {}  # counted, not yet in the database
        self._lock = asyncio.Lock()

    def open(self, access_log: Path, gateway: str, port: int) -> None:
        """Read this (new) log from its start; the proxy listens on ``gateway:port``."""
        self._log, self._proxy, self._offset = access_log, (gateway, port), 0

    async def load(self, experiment_ids: Iterable[str]) -> None:
        """The recorded usage of these experiments (at start, or a new container)."""
        recorded = await self._records.load(experiment_ids)
        await self._stop(self._ledger.set_usage(_pairs(recorded)))

    async def read_log(self) -> None:
        """Count the log's new lines, record them, stop who reached the cap."""
        if self._log is None:
            return
        async with self._lock:
            moved, self._offset = await asyncio.to_thread(self._account, self._log, self._offset)
            for experiment_id, size in moved.items():
                self._unrecorded[experiment_id] = self._unrecorded.get(experiment_id, 0) + size
            if not self._unrecorded:
                return
            try:
                totals = await self._records.add(self._unrecorded)
            except DatabaseUnavailable as exc:
                # Kept for the next read: a command's result never fails for it.
                log.warning("egress.record_failed", reason=str(exc))
                return
            self._unrecorded = {}
            await self._stop(self._ledger.set_usage(_pairs(totals)))

    def _account(self, path: Path, offset: int) -> tuple[dict[str, int], int]:
        """Every new line to its container, chunk by chunk, to the end (blocking)."""
        moved: dict[str, int] = {}
        while True:
            lines, offset = read_new_lines(path, offset)
            if not lines:
                return moved, offset
            for experiment_id, size in self._ledger.account(lines).items():
                moved[experiment_id] = moved.get(experiment_id, 0) + size

    async def check_live(self) -> None:
        """Stop who reaches the cap with the connections still open."""
        if self._proxy is None:
            return
        gateway, port = self._proxy
        live = await asyncio.to_thread(live_bytes, gateway, port)
        await self._stop(self._ledger.over_cap(live))

    async def _stop(self, experiments: set[str]) -> None:
        if not experiments:
            return
        await asyncio.to_thread(self._write_state)  # first: no new connection from now
        for experiment_id in experiments:
            if self._proxy is not None:
                gateway, port = self._proxy
                for address in self._ledger.addresses_of(experiment_id):
                    closed = await asyncio.to_thread(cut, gateway, port, address)
                    log.log(
                        logging.ERROR if closed is None else logging.INFO,
                        "egress.cut_failed" if closed is None else "egress.cut",
                        experiment_id=experiment_id,
                        address=address,
                        connections=closed,
                    )
            try:
                await self._records.mark_capped(experiment_id)
            except DatabaseUnavailable as exc:  # blocked here still; its bytes will say it
                log.warning("egress.record_failed", experiment_id=experiment_id, reason=str(exc))


def _pairs(usage: Mapping[str, Usage]) -> dict[str, tuple[int, bool]]:
    return {key: (u.bytes, u.capped) for key, u in usage.items()}
