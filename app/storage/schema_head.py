"""Whether the database is at the migrations' head, without importing Alembic.

Alembic (with Mako and Pygments behind it) costs about half a second to import, on
every start, for a schema that is almost always current already. The head is read
from the migration files themselves (their ``revision`` and ``down_revision``
lines), the database's revision from ``alembic_version``; only when they differ,
or anything is unusual, does the caller run Alembic (which then decides).
"""

from __future__ import annotations

import re
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

_REVISION = re.compile(r'^revision(?:: str)? = "([^"]+)"$', re.M)
_DOWN = re.compile(r'^down_revision(?:: [^=]+)? = (?:"([^"]+)"|None)$', re.M)


def heads(versions: Path) -> set[str]:
    """The revisions no other migration builds on (empty when a file cannot be read)."""
    revisions: set[str] = set()
    below: set[str] = set()
    for path in versions.glob("*.py"):
        text = path.read_text()
        revision, down = _REVISION.search(text), _DOWN.search(text)
        if revision is None or down is None:
            return set()  # not in the shape we know: let Alembic read it
        revisions.add(revision.group(1))
        if down.group(1):
            below.add(down.group(1))
    return revisions - below


def at_head(connection: Connection, versions: Path) -> bool:
    """Whether ``alembic_version`` holds exactly the single head of ``versions``."""
    head = heads(versions)
    if len(head) != 1:
        return False
    try:
        # Asked first, as a failed SELECT would abort PostgreSQL's transaction.
        if not sa.inspect(connection).has_table("alembic_version"):
            return False  # a new database
        rows = connection.execute(sa.text("SELECT version_num FROM alembic_version")).all()
    except SQLAlchemyError:
        return False
    return {row[0] for row in rows} == head
