"""What the documentation states, read the way tests/unit/app/test_docs_numbers.py reads
it: a name and its value in brackets ("`IDLE_TIMEOUT_S` (600)") or a value and the name
it belongs to ("1 hour (`client_lifetime`)"), in base units (bytes, seconds).

Behaviour tests take their bound from here (``stated``), so the number a user reads is
the one the real server is checked against.
"""

from __future__ import annotations

import re
from pathlib import Path

ENV_PREFIX = "SANDBOX_MCP_"
LIMITS = Path(__file__).parents[2] / "docs" / "limits.md"

UNITS = {
    "": 1,
    "B": 1,
    "KB": 1024,  # Squid's KB, and the docs', are 1024 bytes
    "KiB": 1024,
    "MB": 1024**2,  # the docs' MB, like the code's, is 1,048,576 bytes (or characters)
    "GB": 1024**3,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "s": 1,
    "second": 1,
    "seconds": 1,
    "minute": 60,
    "minutes": 60,
    "hour": 3600,
    "hours": 3600,
    "day": 86400,
    "days": 86400,
}
UNIT = r"(?:KiB|MiB|GiB|KB|MB|GB|B|seconds?|minutes?|hours?|days?|s)"
VALUE = rf"(?:\d[\d,]*(?::\d+)?%?(?:\s+{UNIT})?|an?\s+(?:second|minute|hour|day))"
# "`NAME` (VALUE", or "(`NAME`, VALUE" inside a bracket: the value ends the bracket or
# is followed by ',', ';' or ':'.
NAME_THEN_VALUE = re.compile(
    rf"`(?:{ENV_PREFIX})?([A-Za-z][A-Za-z0-9_]*)`(?: \(|, )({VALUE})(?=[),;:])"
)
# "VALUE ... (`NAME`" : the value, a few words without a comma, a number or another
# name, then the name (or several, comma-separated, that share the value).
NAMES = rf"`(?:{ENV_PREFIX})?[A-Za-z][A-Za-z0-9_]*`(?:, `(?:{ENV_PREFIX})?[A-Za-z][A-Za-z0-9_]*`)*"
VALUE_THEN_NAME = re.compile(
    rf"(?<![\w.,/-])({VALUE})(?:\s+[a-z][a-zA-Z /]*?(?:/\d+)?)?\s+\(({NAMES})[),;]"
)


def number(text: str) -> int | str:
    """A stated value in base units (bytes, seconds), or as written when it is not a
    quantity (`1000:1000`)."""
    text = " ".join(text.split()).replace("%", "")  # a percentage setting is its number
    if ":" in text:
        return text
    article = re.fullmatch(r"an? (\w+)", text)
    if article:
        return UNITS[article.group(1)]
    match = re.fullmatch(rf"(\d[\d,]*)(?: ({UNIT}))?", text)
    assert match, text
    return int(match.group(1).replace(",", "")) * UNITS[match.group(2) or ""]


def stated_pairs(text: str) -> list[tuple[str, str]]:
    """(name, value as written) for every pair of either shape in ``text``."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # not in code blocks
    pairs = [(m.group(1), m.group(2)) for m in NAME_THEN_VALUE.finditer(text)]
    for match in VALUE_THEN_NAME.finditer(text):
        for name in re.findall(r"`([^`]+)`", match.group(2)):
            pairs.append((name.removeprefix(ENV_PREFIX), match.group(1)))
    return pairs


def stated(name: str, page: Path = LIMITS) -> int:
    """The one value ``page`` states for ``name`` (a setting without its prefix, or a
    bound the page names)."""
    values = {number(value) for found, value in stated_pairs(page.read_text()) if found == name}
    assert len(values) == 1, f"{page.name} states {sorted(map(str, values))} for {name}"
    [value] = values
    assert isinstance(value, int), value
    return value
