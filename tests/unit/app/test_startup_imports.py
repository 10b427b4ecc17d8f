"""Start-up imports only what serving needs: a SQLite server never loads PostgreSQL's
driver or dialect (they were a fifth of the import of app.root.main; issue 13's /health)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bytecode_probe import UNCOMPILED_MODULES

DEFERRED = ("asyncpg", "sqlalchemy.dialects.postgresql")


def test_importing_the_server_leaves_postgresql_unloaded() -> None:
    probe = (
        "import json, sys; import app.root.main; "
        f"print(json.dumps([m for m in {list(DEFERRED)!r} if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_installed_dependencies_are_precompiled() -> None:
    """The server runs with PYTHONDONTWRITEBYTECODE (CI, the image): a dependency without
    its .pyc is compiled again at every start (1.2 s of the 2 s budget, measured)."""
    done = subprocess.run(
        [sys.executable, "-c", UNCOMPILED_MODULES],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
