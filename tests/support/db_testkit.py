"""The one way a test gets a database: a migrated SQLite file (PostgreSQL tests have theirs)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from app.storage.db import create_engine, upgrade_schema


async def migrated_sqlite(folder: Path) -> AsyncEngine:
    """A SQLite database in ``folder`` with every migration applied; dispose it when done."""
    engine = create_engine(f"sqlite+aiosqlite:///{folder / 'db.sqlite'}")
    await upgrade_schema(engine)
    return engine
