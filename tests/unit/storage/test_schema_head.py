"""A start on a current schema skips Alembic (and its import); any other state runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from app.storage.db import MIGRATIONS, create_engine, upgrade_schema
from app.storage.schema_head import at_head, heads

VERSIONS = MIGRATIONS / "versions"


def migration(folder: Path, revision: str, down: str | None) -> None:
    below = f'"{down}"' if down else "None"
    (folder / f"{revision}.py").write_text(
        f'revision: str = "{revision}"\ndown_revision: str | None = {below}\n'
    )


def test_the_head_is_the_revision_nothing_builds_on(tmp_path: Path) -> None:
    migration(tmp_path, "0001", None)
    migration(tmp_path, "0002", "0001")
    migration(tmp_path, "0003", "0002")
    assert heads(tmp_path) == {"0003"}
    migration(tmp_path, "0004", "0002")  # two branches: Alembic must decide
    assert heads(tmp_path) == {"0003", "0004"}
    (tmp_path / "odd.py").write_text("revision = make_it()\n")
    assert heads(tmp_path) == set()


async def test_only_a_database_at_the_single_head_counts_as_current(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    try:
        async with engine.begin() as connection:
            assert not await connection.run_sync(at_head, VERSIONS)  # a new database
        await upgrade_schema(engine)
        async with engine.begin() as connection:
            assert await connection.run_sync(at_head, VERSIONS)
            # Behind (or ahead, or another branch): Alembic must run and decide.
            await connection.execute(sa.text("UPDATE alembic_version SET version_num = '0006'"))
            assert not await connection.run_sync(at_head, VERSIONS)
    finally:
        await engine.dispose()


def test_a_start_on_a_current_schema_never_imports_alembic(tmp_path: Path) -> None:
    script = (
        "import asyncio, sys\n"
        "from app.storage.db import create_engine, upgrade_schema\n"
        f"engine = create_engine('sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}')\n"
        "asyncio.run(upgrade_schema(engine))\n"
        "print('alembic' in sys.modules)\n"
    )
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    again = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert (first.stdout, again.stdout) == ("True\n", "False\n"), (first.stderr, again.stderr)
