"""SQLite's one writer at a time, taken in turn, the sign-in's first.

SQLite lets one transaction write at a time, and one that finds the database locked
polls for it (``busy_timeout``: sleeps of 1 ms growing to 100 ms), so under a steady
stream of writers a waiting one is passed over again and again, however short each
transaction is: under the fairness bench's attack, once the sign-in had connections
of its own and its serialized decisions were batched, a token redemption's first
write still waited up to 4.5 s (p99) and an admission batch's insert 1.7 s, behind
the tenants' writers (issue 25; claude.ai gives up on a token request after 10 s). A
SQLite server is one process (``app.root.state_lock``), so its writers can queue in
order instead: each transaction takes its turn before its first write and gives it
back when it ends (commit, rollback, or its connection returned or dropped), and the
sign-in's engine (``app.storage.signin.front_door``) goes ahead of the tenants' work. Its
writes are few, each bounded by a budget. A turn is waited for at most
``TURN_WAIT_S``, then SQLite's own lock decides, as without turns.

PostgreSQL locks rows, not the database, and needs none of this.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import await_only

# A turn never waited for longer than SQLite itself would (the busy timeout, 30 s):
# past it the writer goes on and SQLite's own lock decides, as without turns.
TURN_WAIT_S = 30
_HOLDS = "sqlite_write_turn"
_READS = ("SELECT", "PRAGMA", "BEGIN", "SAVEPOINT", "RELEASE")


class WriteTurns:
    """One writer at a time, in order of asking, the front door's before the others."""

    def __init__(self) -> None:
        self._held = False
        self._waiting: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (
            deque(),
            deque(),
        )

    @property
    def waiting(self) -> int:
        """How many writers wait for their turn."""
        return sum(not turn.done() for queue in self._waiting for turn in queue)

    async def take(self, first: bool) -> bool:
        """Wait for the turn (at most TURN_WAIT_S); True if it was given."""
        if not self._held:
            self._held = True
            return True
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[0 if first else 1].append(turn)
        try:
            await asyncio.wait_for(asyncio.shield(turn), TURN_WAIT_S)
        except TimeoutError:
            if turn.done() and not turn.cancelled():
                return True  # given as the wait ended
            turn.cancel()
            return False
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.give_back()  # handed over as the caller was cancelled: pass it on
            else:
                turn.cancel()
            raise
        return True

    def give_back(self) -> None:
        for queue in self._waiting:
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)  # still held: handed to the next writer
                    return
        self._held = False


def in_turns(service: AsyncEngine, *front_door: AsyncEngine) -> None:
    """On SQLite, make the engines' writers take turns, ``front_door``'s first."""
    if service.dialect.name != "sqlite":
        return
    turns = WriteTurns()
    take_turns(service, turns, first=False)
    for engine in front_door:
        take_turns(engine, turns, first=True)


def take_turns(engine: AsyncEngine, turns: WriteTurns, *, first: bool) -> None:
    """Make every transaction of ``engine`` take ``turns`` before its first write."""

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _before_write(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if conn.info.get(_HOLDS) or statement.lstrip()[:9].upper().startswith(_READS):
            return
        # Runs inside SQLAlchemy's bridge from the async caller: await_only waits there.
        conn.info[_HOLDS] = await_only(turns.take(first))

    def _end(conn: Any, *_: Any) -> None:
        if conn.info.pop(_HOLDS, False):
            turns.give_back()

    # Given back when the transaction ends, or at the latest when its connection
    # returns to the pool or is dropped (a connection that failed mid-transaction).
    event.listen(engine.sync_engine, "commit", _end)
    event.listen(engine.sync_engine, "rollback", _end)

    def _returned(_dbapi: Any, record: Any, *_: Any) -> None:
        if record.info.pop(_HOLDS, False):
            turns.give_back()

    event.listen(engine.sync_engine.pool, "checkin", _returned)
    event.listen(engine.sync_engine.pool, "invalidate", _returned)
