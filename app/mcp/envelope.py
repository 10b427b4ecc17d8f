"""The result envelope: what every tool result carries beside the domain's record.

The domain returns plain records (``app.experiments.core.result.Result`` and friends);
the runner wraps them here, adding the sandbox's idle expiry and the pool's
one-time notes. ``enveloped(Model)`` is the output schema a tool declares: the
record's fields plus the envelope's, under the record's own name.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, Field, create_model

from app.mcp.fit import STRUCTURED_BUDGET, fit

NOTES_DESCRIPTION = "One-time messages for the agent (read them)."
IDLE_EXPIRY_DESCRIPTION = (
    "Seconds your sandbox survives without activity from now on; after that it is "
    "emptied and its slot given to someone else. Set on calls that use the sandbox."
)


class ToolOutput(BaseModel):
    """The envelope alone, for results the tool layer builds itself."""

    notes: list[str] = Field(default_factory=list, description=NOTES_DESCRIPTION)
    idle_expiry_s: int | None = Field(default=None, description=IDLE_EXPIRY_DESCRIPTION)


@functools.cache
def enveloped(record: type[BaseModel]) -> type[BaseModel]:
    """``record``'s fields plus the envelope's: the ``outputSchema`` of a tool returning it."""
    if issubclass(record, ToolOutput):
        return record
    fields: dict[str, Any] = {
        "idle_expiry_s": (int | None, Field(default=None, description=IDLE_EXPIRY_DESCRIPTION))
    }
    if "notes" not in record.model_fields:
        fields["notes"] = (list[str], Field(default_factory=list, description=NOTES_DESCRIPTION))
    model: type[BaseModel] = create_model(record.__name__, __base__=record, **fields)
    return model


def ok_result(
    record: BaseModel, *, notes: list[str] | None = None, idle_expiry_s: int | None = None
) -> CallToolResult:
    """Wrap ``record``: the envelope's ``notes`` come first, then the record's own."""
    structured = record.model_dump(mode="json")
    if not _tells_itself(type(record)):
        # The text is the compact JSON of the result: when that fits with room to spare,
        # the record alone fits too (the envelope only adds), so nothing is cut and the
        # one serialization serves both the check and the text.
        enveloped = _with_envelope(dict(structured), notes, [], idle_expiry_s)
        text = _COMPACT.encode(enveloped)
        if len(text.encode()) <= STRUCTURED_BUDGET - _SPARE:  # the budget is in bytes
            lines = [*(f"Note: {note}" for note in enveloped["notes"]), text]
            return CallToolResult(
                content=[TextContent(type="text", text="\n".join(lines))],
                structured_content=enveloped,
            )
    cut = fit(structured)
    if cut:
        # The text is made from what is left, so the two never disagree.
        record = type(record).model_validate(structured)
    _with_envelope(structured, notes, cut, idle_expiry_s)
    return CallToolResult(
        content=[TextContent(type="text", text=readable(record, structured))],
        structured_content=structured,
    )


# ``json.dumps(..., separators=(",", ":"), ensure_ascii=False)`` built this encoder
# anew for every result; one serves them all (it keeps no state between calls).
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


@functools.cache
def _tells_itself(record: type[BaseModel]) -> bool:
    """Whether ``record``'s results are told by their own ``as_text()``. Asked of the
    class once: a missing attribute goes through pydantic's ``__getattr__``, which cost
    a light call's result as much as serializing it."""
    return callable(getattr(record, "as_text", None))


# Characters the envelope may take away from a record's JSON (an ``idle_expiry_s`` of
# ``600`` in place of ``null``): a margin, so that a text that fits proves the record fits.
_SPARE = 16


def _with_envelope(
    structured: dict[str, Any], notes: list[str] | None, cut: list[str], idle_expiry_s: int | None
) -> dict[str, Any]:
    structured["notes"] = [*(notes or []), *structured.get("notes", []), *cut]
    structured.setdefault("idle_expiry_s", None)
    if idle_expiry_s is not None:
        structured["idle_expiry_s"] = idle_expiry_s
    return structured


def readable(record: BaseModel, structured: dict[str, Any]) -> str:
    """The text content, written for the model: the notes first, then the record as its
    own ``as_text()`` tells it (a command's output as plain text), else compact JSON.

    Not a pretty-printed copy of the structured content: that doubled every result.
    """
    lines = [f"Note: {note}" for note in structured["notes"]]
    if _tells_itself(type(record)):
        lines.append(str(record.as_text()))  # type: ignore[attr-defined]
    else:
        lines.append(_COMPACT.encode(structured))
    return "\n".join(lines)


@dataclass(frozen=True)
class ToolFailure:
    code: str
    message: str
    details: dict[str, object]


def error_result(failure: ToolFailure, request_id: str) -> CallToolResult:
    structured: dict[str, object] = {
        "error": {"code": failure.code, "message": failure.message, **failure.details},
        "request_id": request_id,
    }
    text = f"{failure.code}: {failure.message}"
    if failure.details:
        text += "\n" + json.dumps(failure.details, default=str, sort_keys=True)
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=True,
    )
