"""The count of a body's JSON values, before the SDK parses it (request_bounds.py)."""

from __future__ import annotations

import json

from app.mcp.request_bounds import MAX_ESCAPES, MAX_VALUES, LargeBodies, refusal


def test_many_values_are_refused_and_the_same_characters_inside_a_string_are_not() -> None:
    values = json.dumps({"pad": [{}] * (MAX_VALUES + 1)}).encode()
    assert refusal(values) is not None
    assert f"{MAX_VALUES:,} JSON values" in (refusal(values) or "")
    text = json.dumps({"content": "[{},{}]," * MAX_VALUES}).encode()
    assert refusal(text) is None


def test_an_escaped_quote_does_not_end_a_string() -> None:
    # Inside the one string: escaped quotes, then what would be values outside it.
    text = json.dumps({"content": '\\"' + '"' + "[{}]," * MAX_VALUES}).encode()
    assert refusal(text) is None
    # The same number of strings, each a value, is refused.
    strings = json.dumps([""] * (MAX_VALUES + 1)).encode()
    assert refusal(strings) is not None


def test_a_body_of_too_many_escapes_is_refused() -> None:
    body = json.dumps({"content": "\n" * (MAX_ESCAPES + 1)}).encode()
    assert "escaped characters" in (refusal(body) or "")
    assert refusal(json.dumps({"content": "\n" * 1000}).encode()) is None


def test_an_address_holds_its_share_and_gets_it_back() -> None:
    bodies = LargeBodies(per_address=2)
    assert bodies.enter("a")
    assert bodies.enter("a")
    assert not bodies.enter("a")
    assert bodies.enter("b")
    bodies.leave("a")
    assert bodies.enter("a")
