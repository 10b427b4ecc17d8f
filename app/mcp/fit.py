"""Results cut to fit the clients' windows, whatever a tool returned.

Claude Code caps a tool result at 25,000 tokens by default (``MAX_MCP_OUTPUT_TOKENS``)
and claude.ai's connectors at about 150,000 characters; a result over the cap reaches
the model cut off mid-JSON, or as an error. Tools bound their own results (an output
excerpt, a read of at most ``max_bytes``, ``max_results``); this is the net under
them: while the structured content is over its budget, its largest list loses its
second half, or its largest string keeps its head and tail, and a note says which
field was cut and how to get the rest. Lists and strings only shrink, so the result
still matches the tool's output schema.
"""

from __future__ import annotations

import json
from typing import Any

# Structured content, in bytes of its UTF-8 JSON; the text content is about the same
# again. Bytes, not characters: a token is about four ASCII characters but about one
# CJK character (three bytes), so a result of non-ASCII text counted in characters took
# three times the tokens (48,527 characters of diff came to 226 KB as sent).
STRUCTURED_BUDGET = 24_000
# What one result's text and structured content come to together, at most: about 20k
# tokens, the context a single result may take. The structured content is cut to
# STRUCTURED_BUDGET and the text is made from what is left, so a result stays near
# twice that (tests/e2e/test_claude_clients_over_http.py measures it over HTTP). The
# tools whose results can be large declare it to Claude Code as
# ``_meta["anthropic/maxResultSizeChars"]`` (schemas.py): it keeps a result under
# that many characters in the conversation, where by default it would write one over
# 50,000 characters (or 25,000 tokens) to a file and show the model a 2 KB preview.
MAX_RESULT_CHARS = 80_000
_KEEP_HEAD = 0.3  # of a cut string, the share kept from its start (the end matters more)


def fit(structured: dict[str, Any], budget: int = STRUCTURED_BUDGET) -> list[str]:
    """Shrink ``structured`` in place until it serializes under ``budget`` bytes;
    returns one note per cut (empty when it already fitted)."""
    cuts: dict[str, tuple[int, int, str]] = {}  # path -> (kept, total, unit)
    for _ in range(64):  # each pass halves something: a bound, not a loop on luck
        size = _size(structured)
        if size <= budget:
            break
        found = _largest(structured)
        if found is None:
            break
        path, holder, key, value = found
        excess = size - budget
        if isinstance(value, list):
            total = cuts.get(path, (0, len(value), ""))[1]
            holder[key] = value[: len(value) // 2]
            cuts[path] = (len(holder[key]), total, "entries")
        else:
            total = cuts.get(path, (0, len(value), ""))[1]
            # The excess is in bytes of JSON, where a quote, a backslash or a control
            # character takes two to six, a non-ASCII character two to four: take away
            # as many of the string's own characters as make up that much JSON (a file
            # of escapes kept nothing).
            per_char = _size(value) / max(1, len(value))
            keep = max(0, len(value) - int((excess + 200) / per_char) - 1)
            head = int(keep * _KEEP_HEAD)
            tail = keep - head
            left_out = len(value) - keep
            holder[key] = (
                value[:head]
                + f"\n[... {left_out} characters cut to fit the client's window ...]\n"
                + (value[-tail:] if tail else "")
            )
            cuts[path] = (keep, total, "characters")
    return [
        f"This result was cut to fit the client's window: `{path}` keeps {kept} of its "
        f"{total} {unit}. Ask for less at a time (a narrower path, a line range, a smaller "
        "limit, or pages) to see the rest."
        for path, (kept, total, unit) in cuts.items()
    ]


def _size(value: Any) -> int:
    """Bytes of ``value``'s compact UTF-8 JSON (an escape as its two to six characters, a
    non-ASCII character as its two to four bytes)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _largest(value: Any, path: str = "", depth: int = 0) -> tuple[str, Any, Any, Any] | None:
    """The largest cuttable value below ``value``: (path, its holder, its key, it).

    One walk, each value measured once: a result of thousands of entries must not
    cost thousands of serializations of itself (this runs on the event loop).
    """
    best: tuple[str, Any, Any, Any] | None = None
    best_size = -1
    stack: list[tuple[Any, str, int]] = [(value, path, depth)]
    while stack:
        node, node_path, level = stack.pop()
        if level > 6:
            continue
        items = (
            list(node.items())
            if isinstance(node, dict)
            else list(enumerate(node))
            if isinstance(node, list)
            else []
        )
        for key, child in items:
            if key == "notes" and isinstance(node, dict):
                continue  # the notes say what was cut; never cut them
            child_path = f"{node_path}.{key}" if node_path else str(key)
            if isinstance(child, str | list) and len(child) > 1:
                size = len(child.encode()) if isinstance(child, str) else _size(child)
                if size > best_size:
                    best, best_size = (child_path, node, key, child), size
            # Look inside dicts, and inside lists of containers (a list of strings
            # holds nothing larger than itself).
            nested = isinstance(child, list) and bool(child) and isinstance(child[0], dict | list)
            if isinstance(child, dict) or nested:
                stack.append((child, child_path, level + 1))
    return best
