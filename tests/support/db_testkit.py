"""The one way a test gets a database: a migrated SQLite file (PostgreSQL tests have theirs)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from app.experiments.records import Experiment
from app.experiments.states import State
from app.storage.db import create_engine, upgrade_schema


async def migrated_sqlite(folder: Path) -> AsyncEngine:
    """A SQLite database in ``folder`` with every migration applied; dispose it when done."""
    engine = create_engine(f"sqlite+aiosqlite:///{folder / 'db.sqlite'}")
    await upgrade_schema(engine)
    return engine


def an_experiment(experiment_id: str, sandbox_key: str = "k") -> Experiment:
    """A just-created experiment record, for tests of the stores."""
    return Experiment(
        experiment_id=experiment_id,
        sandbox_key=sandbox_key,
        name="",
        goal="",
        state=State.CREATING,
        image="sandbox-mcp/python:3",
        container_id=None,
        isolation={},
        warnings=[],
        source="empty",
        created_at=0.0,
        updated_at=0.0,
        findings=None,
    )
