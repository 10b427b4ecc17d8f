"""The tool listing, trimmed to what its readers use (issue 25).

``tools/list`` was 91 KB, 61 KB of it output schemas as pydantic writes them: a
``title`` on every field ("Job Id" for ``job_id``), a ``default``, a description of
each field, ``anyOf`` with ``null`` for every optional value, and the job record
repeated in nine tools. Claude's clients load the whole listing into every
conversation, and the model reads the names, titles, descriptions and input schemas
of the tools, never their output schemas (a client validates a result against those).

So an output schema keeps its structure and nothing else: types, properties,
``required``, enums, ``$defs``; no title, default or description (what a field means
is in the tool's description, in the result's own text and notes, and in
docs/tools.md), and ``anyOf: [X, null]`` written as ``type: [x, "null"]``. Every
result that matched the full schema matches the trimmed one and nothing else does:
the keywords dropped are annotations, and the rewrite of ``anyOf`` is the same
condition. An input schema loses only the generated field titles (the model reads
it: descriptions and defaults stay).

The tools whose results can be large (file reads, searches, listings, diffs, command
output) declare ``_meta["anthropic/maxResultSizeChars"]``: the bound on any result
(``fit.MAX_RESULT_CHARS``), which Claude Code then keeps in the conversation whole.
"""

from __future__ import annotations

from typing import Any

from app.mcp.fit import MAX_RESULT_CHARS

RESULT_SIZE_KEY = "anthropic/maxResultSizeChars"
# The tools whose result can pass Claude Code's default 50,000 characters: what they
# return grows with the sandbox's files or a command's output (each is cut by fit.py).
LARGE_RESULT_TOOLS = frozenset(
    {
        "read_sandbox_file",
        "search_sandbox",
        "list_sandbox_files",
        "map_project",
        "inspect_changes",
        "compare_experiments",
        "get_experiment",
        "list_experiments",
        "get_job_status",
        "get_job_result",
        "execute_experiment",
        "run_tests",
    }
)


def declared_meta(tool: str, meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """The tool's ``_meta``, with its result bound declared when its results can be large."""
    if tool not in LARGE_RESULT_TOOLS:
        return meta
    return {**(meta or {}), RESULT_SIZE_KEY: MAX_RESULT_CHARS}


# Keywords that never change what validates (JSON Schema 2020-12, "annotations").
_OUTPUT_ANNOTATIONS = frozenset({"title", "default", "description", "examples"})
_INPUT_ANNOTATIONS = frozenset({"title"})
# Keywords whose value maps names to schemas (a property called "title" is no keyword).
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties"})
# What an ``anyOf`` branch may hold to be merged with a ``null`` branch: keywords that
# constrain only values of its own type, so that they let ``null`` through either way.
_TYPE_BOUND = frozenset(
    {
        "type",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "properties",
        "required",
        "additionalProperties",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        *_OUTPUT_ANNOTATIONS,
    }
)
_NULL = {"type": "null"}


def trimmed_output_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with no annotations and its nullable values written compactly."""
    trimmed: dict[str, Any] = _trim(schema, _OUTPUT_ANNOTATIONS, merge_null=True)
    return trimmed


def trimmed_input_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without the field titles pydantic generates from the field names."""
    trimmed: dict[str, Any] = _trim(schema, _INPUT_ANNOTATIONS, merge_null=False)
    return trimmed


def _trim(node: Any, drop: frozenset[str], *, merge_null: bool) -> Any:
    if isinstance(node, list):
        return [_trim(item, drop, merge_null=merge_null) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in drop:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {
                name: _trim(sub, drop, merge_null=merge_null) for name, sub in value.items()
            }
        else:
            out[key] = _trim(value, drop, merge_null=merge_null)
    return _merged_null(out) if merge_null else out


def _merged_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``{anyOf: [{type: t, ...}, {type: null}]}`` as ``{type: [t, null], ...}``."""
    branches = schema.get("anyOf")
    if not isinstance(branches, list) or len(branches) != 2 or _NULL not in branches:
        return schema
    other = branches[1] if branches[0] == _NULL else branches[0]
    if not isinstance(other, dict) or not isinstance(other.get("type"), str):
        return schema  # a $ref, an enum, a union: left as written
    if not other.keys() <= _TYPE_BOUND or other.keys() & schema.keys() - {"anyOf"}:
        return schema
    rest = {key: value for key, value in schema.items() if key != "anyOf"}
    return {**other, **rest, "type": [other["type"], "null"]}
