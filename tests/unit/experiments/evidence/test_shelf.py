"""The shelf: one sandbox's artifacts have a byte budget, whatever the number of calls."""

from __future__ import annotations

import asyncio
from pathlib import Path

from db_testkit import an_experiment
from sqlalchemy.ext.asyncio import AsyncEngine

from app.experiments.evidence.shelf import ArtifactShelf
from app.storage.experiment_store import SqlExperimentStore


async def test_a_sandbox_cannot_shelve_more_than_its_budget(
    sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    records = SqlExperimentStore(sqlite_engine)
    for key in ("greedy", "other"):
        await records.add(an_experiment(f"exp_{key}", key), "created")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    for n in range(6):
        (workspace / f"f{n}.bin").write_bytes(b"x" * 1000)
    shelf = ArtifactShelf(records, tmp_path / "shelf", 86_400, max_bytes=3500)

    # Many collections at once: together they never pass the budget.
    listings = await asyncio.gather(
        *(
            shelf.collect("greedy", "exp_greedy", workspace, [f"f{n}.bin"], asyncio.to_thread)
            for n in range(6)
        )
    )
    assert await records.artifact_bytes_of("greedy") == 3000
    refused = [item for listing in listings for item in listing.skipped]
    assert sum("over the artifact space left" in item for item in refused) == 3
    assert any("Your sandbox keeps at most" in item for item in refused)

    # Another sandbox's budget is its own.
    mine = await shelf.collect("other", "exp_other", workspace, ["f*.bin"], asyncio.to_thread)
    assert len(mine.artifacts) == 3
    assert await records.artifact_bytes_of("other") == 3000
