"""The fields every tool result carries, whatever the tool."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ToolOutput(BaseModel):
    notes: list[str] = Field(
        default_factory=list, description="One-time messages for the agent (read them)."
    )
    idle_expiry_s: int | None = Field(
        default=None,
        description=(
            "Seconds your sandbox survives without activity from now on; after that it is "
            "emptied and its slot given to someone else. Set on calls that use the sandbox."
        ),
    )
