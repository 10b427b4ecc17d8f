"""The artifact shelf: collected files, outside every slot, kept a while after their sandbox.

Each sandbox has its own folder, ``<artifact dir>/<sandbox fingerprint>``; the
clock of an artifact starts when its sandbox is emptied.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

from app.experiments.core.errors import ArtifactTooLarge, ExperimentNotFound
from app.experiments.core.records import ArtifactRecord
from app.experiments.core.store import ExperimentStore
from app.experiments.evidence import artifacts
from app.experiments.evidence.artifacts import Artifact, ArtifactList
from jail.context import InThread

# The most one read of an artifact returns. The MCP SDK base64-encodes and serialises a
# read on the event loop (a 20 MB artifact held it about 200 ms and 75 MB); a larger
# artifact is read in parts of this size (about 10 ms and 5 MB each).
ARTIFACT_PART_BYTES = 1_048_576


def artifact_uri(experiment_id: str, artifact_id: str) -> str:
    return f"sandbox://experiments/{experiment_id}/artifacts/{artifact_id}"


def parts_of(size: int) -> int:
    """How many reads an artifact of ``size`` bytes takes (one, when it is empty)."""
    return max(1, -(-size // ARTIFACT_PART_BYTES))


def fingerprint(sandbox_key: str) -> str:
    """A stable, non-reversible label for containers, folders and logs."""
    return "sbx-" + hashlib.sha256(sandbox_key.encode()).hexdigest()[:12]


class ArtifactShelf:
    def __init__(
        self,
        records: ExperimentStore,
        directory: Path,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
        *,
        max_bytes: int = 200 * 1_048_576,
    ) -> None:
        self._records = records
        self._directory = directory
        self._ttl_s = ttl_s
        self._clock = clock
        self._max_bytes = max_bytes
        # One collection at a time per sandbox, so two cannot both fit the same room.
        self._collecting: dict[str, asyncio.Lock] = {}

    def folder(self, sandbox_key: str) -> Path:
        return self._directory / fingerprint(sandbox_key)

    async def collect(
        self,
        sandbox_key: str,
        experiment_id: str,
        workspace: Path,
        patterns: list[str],
        in_thread: InThread,
    ) -> ArtifactList:
        """Copy the matching files to the shelf, in a thread of the caller's share."""
        lock = self._collecting.setdefault(sandbox_key, asyncio.Lock())
        try:
            async with lock:
                return await self._collect(
                    sandbox_key, experiment_id, workspace, patterns, in_thread
                )
        finally:
            if not lock.locked() and self._collecting.get(sandbox_key) is lock:
                del self._collecting[sandbox_key]

    async def _collect(
        self,
        sandbox_key: str,
        experiment_id: str,
        workspace: Path,
        patterns: list[str],
        in_thread: InThread,
    ) -> ArtifactList:
        held = await self._records.artifact_bytes_of(sandbox_key)
        room = max(0, self._max_bytes - held)
        collected, skipped = await in_thread(
            artifacts.collect, workspace, patterns, self.folder(sandbox_key), room
        )
        if any(
            reason.endswith("over the artifact space left to your sandbox") for reason in skipped
        ):
            skipped.append(
                f"Your sandbox keeps at most {self._max_bytes // 1_048_576} MB of artifacts "
                f"({held // 1_048_576} MB held); they expire a while after the sandbox is emptied."
            )
        now = self._clock()
        await self._records.add_artifacts(
            [
                ArtifactRecord(
                    artifact_id=c.artifact_id,
                    experiment_id=experiment_id,
                    sandbox_key=sandbox_key,
                    path=c.path,
                    size=c.size,
                    sha256=c.sha256,
                    stored_as=c.stored_as,
                    created_at=now,
                    expires_at=None,
                )
                for c in collected
            ]
        )
        return await self.listing(sandbox_key, experiment_id, skipped)

    async def listing(
        self, sandbox_key: str, experiment_id: str, skipped: list[str] | None = None
    ) -> ArtifactList:
        rows = await self._records.artifacts_of(sandbox_key, experiment_id)
        return ArtifactList(
            experiment_id=experiment_id,
            artifacts=[
                Artifact(
                    artifact_id=row.artifact_id,
                    path=row.path,
                    size=row.size,
                    sha256=row.sha256,
                    uri=artifact_uri(experiment_id, row.artifact_id),
                    parts=parts_of(row.size),
                )
                for row in rows
            ],
            skipped=skipped or [],
        )

    async def record(
        self, sandbox_key: str, experiment_id: str, artifact_id: str
    ) -> ArtifactRecord:
        rows = await self._records.artifacts_of(sandbox_key, experiment_id)
        row = next((r for r in rows if r.artifact_id == artifact_id), None)
        if row is None:
            raise ExperimentNotFound("artifact", artifact_id)
        return row

    async def read_part(
        self,
        sandbox_key: str,
        experiment_id: str,
        artifact_id: str,
        part: int | None,
        in_thread: InThread,
    ) -> tuple[ArtifactRecord, bytes]:
        """The artifact whole (``part`` None) when it fits in one part, else its ``part``
        (from 0): never more than ``ARTIFACT_PART_BYTES`` in memory.

        Raises:
            ArtifactTooLarge: a whole read of a larger artifact, or a part past its end;
                the message names the parts to read.
        """
        row = await self.record(sandbox_key, experiment_id, artifact_id)
        parts = parts_of(row.size)
        if (part is None and parts > 1) or (part is not None and not 0 <= part < parts):
            whole = f"{artifact_uri(experiment_id, artifact_id)}/parts/N"
            raise ArtifactTooLarge(
                f"This artifact is {row.size:,} bytes; a read returns at most "
                f"{ARTIFACT_PART_BYTES:,}. Read it in {parts} parts: {whole} for N from 0 "
                f"to {parts - 1}, and join them in order.",
                size=row.size,
                parts=parts,
            )

        def read() -> bytes:
            with (self.folder(sandbox_key) / row.stored_as).open("rb") as stored:
                stored.seek((part or 0) * ARTIFACT_PART_BYTES)
                return stored.read(ARTIFACT_PART_BYTES)

        return row, await in_thread(read)

    async def start_clock(self, sandbox_key: str) -> None:
        """The sandbox is being emptied: its artifacts now live ``ttl_s`` more."""
        await self._records.start_artifact_clock(sandbox_key, self._clock() + self._ttl_s)

    async def expire(self) -> int:
        """Delete artifacts whose sandbox was emptied more than the TTL ago."""
        rows = await self._records.expired_artifacts(self._clock())
        for row in rows:
            await asyncio.to_thread((self.folder(row.sandbox_key) / row.stored_as).unlink, True)
        if rows:
            await self._records.delete_artifacts([row.artifact_id for row in rows])
        return len(rows)
