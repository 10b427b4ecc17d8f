"""The base of every record the domain hands back: plain data, plus what the agent should read.

The wire envelope (the sandbox's idle expiry, the pool's one-time notes) is added by
the tool runner (``app/mcp/envelope.py``); nothing here knows of it.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class Result(BaseModel):
    notes: list[str] = Field(
        default_factory=list, description="One-time messages for the agent (read them)."
    )
