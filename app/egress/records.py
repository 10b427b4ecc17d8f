"""The egress records the meter and the proxy read and write: plain, frozen data.

Kept by ``app.storage.egress_store.SqlUsageRecords`` behind the meter's
``UsageRecords`` Protocol (:mod:`app.egress.meter`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    bytes: int
    capped: bool
    refused: int = 0


@dataclass(frozen=True)
class Notice:
    container_id: str
    experiment_id: str
    kind: str  # "refused" or "cap"
    text: str = ""
