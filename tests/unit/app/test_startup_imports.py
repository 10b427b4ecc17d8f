"""Start-up imports only what serving needs: a SQLite server never loads PostgreSQL's
driver or dialect (they were a fifth of the import of app.main; issue 13's /health)."""

from __future__ import annotations

import json
import subprocess
import sys

DEFERRED = ("asyncpg", "sqlalchemy.dialects.postgresql")


def test_importing_the_server_leaves_postgresql_unloaded() -> None:
    probe = (
        "import json, sys; import app.main; "
        f"print(json.dumps([m for m in {list(DEFERRED)!r} if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
