"""The sign-in's database connections: a reserve no tenant's work can take.

The sign-in's store (registration, the sign-in page and its press, the token and
refresh grants, the bearer check's reads) and the shared rate ledger run on an engine
of their own, of ``FRONT_DOOR_CONNECTIONS`` connections. On the service's engine they
queued for its 15 connections behind the tenants' tool calls (issue 25: claude.ai
gives up on a sign-in request after 10 s, on a refresh after 30 s). The decisions
every process serializes (the ledger's takes, the sign-in's admissions) are taken in
batches (``app.storage.batches``), so each holds one connection at a time, whatever
the size of a flood; the sign-in page's reads and the token grants share the rest.

Bound: a process holds at most 15 + FRONT_DOOR_CONNECTIONS database connections
(besides the LISTEN channels on PostgreSQL).
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.storage.db import create_engine

FRONT_DOOR_CONNECTIONS = 6


def front_door_engine(url: str) -> AsyncEngine:
    """The engine of the sign-in's store and of the shared rate ledger."""
    return create_engine(url, connections=FRONT_DOOR_CONNECTIONS)
