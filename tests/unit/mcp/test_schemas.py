"""The tool listing's schemas, trimmed: smaller, and the same values validate."""

from __future__ import annotations

from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, Field

from app.mcp.schemas import trimmed_input_schema, trimmed_output_schema


class Page(BaseModel):
    text: str = Field(description="A page.")
    more: bool = False


class Record(BaseModel):
    title: str = Field(description="A field called title: a property, not the keyword.")
    code: int | None = Field(default=None, description="The exit code.")
    stream: Literal["stdout", "stderr"] | None = None
    tags: list[str] | None = Field(default=None, max_length=3)
    extra: dict[str, Any] | None = None
    page: Page | None = Field(default=None, description="A page, when asked for.")
    either: int | str = 0


SCHEMA = Record.model_json_schema()

VALUES: list[Any] = [
    {"title": "t"},
    {"title": "t", "code": None, "stream": None, "tags": None, "extra": None, "page": None},
    {"title": "t", "code": 3, "stream": "stdout", "tags": ["a"], "extra": {"k": 1}},
    {"title": "t", "page": {"text": "x", "more": True}, "either": "s"},
    {"title": "t", "code": "3"},  # invalid from here on
    {"title": "t", "stream": "stdin"},
    {"title": "t", "tags": ["a", "b", "c", "d"]},
    {"title": "t", "tags": "a"},
    {"title": "t", "extra": []},
    {"title": "t", "page": {"more": True}},
    {"title": "t", "either": 1.5},
    {"code": 1},
    {"title": None},
]


def valid(schema: dict[str, Any], value: Any) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def test_a_trimmed_output_schema_accepts_exactly_what_the_full_one_accepts() -> None:
    trimmed = trimmed_output_schema(SCHEMA)
    verdicts = [(valid(SCHEMA, v), valid(trimmed, v)) for v in VALUES]
    assert [full for full, _ in verdicts] == [True] * 4 + [False] * 9, "the samples cover both"
    assert [t for _, t in verdicts] == [f for f, _ in verdicts]


def test_a_trimmed_output_schema_has_no_prose_and_writes_nullable_values_compactly() -> None:
    trimmed = trimmed_output_schema(SCHEMA)
    properties = trimmed["properties"]
    assert properties["title"] == {"type": "string"}, "the property called title stays"
    assert properties["code"] == {"type": ["integer", "null"]}
    assert properties["tags"] == {
        "items": {"type": "string"},
        "maxItems": 3,
        "type": ["array", "null"],
    }
    # A $ref, an enum or a union is left as written, without its prose.
    assert properties["page"] == {"anyOf": [{"$ref": "#/$defs/Page"}, {"type": "null"}]}
    assert properties["stream"] == {
        "anyOf": [{"enum": ["stdout", "stderr"], "type": "string"}, {"type": "null"}]
    }
    assert "anyOf" in properties["either"]
    text = repr(trimmed)
    assert "description" not in text
    assert "'default'" not in text
    assert "Title" not in text
    assert len(repr(SCHEMA)) > 1.5 * len(text)


def test_a_trimmed_input_schema_keeps_what_the_model_reads() -> None:
    trimmed = trimmed_input_schema(SCHEMA)
    properties = trimmed["properties"]
    assert properties["code"] == {
        "anyOf": [{"type": "integer"}, {"type": "null"}],
        "default": None,
        "description": "The exit code.",
    }
    assert "title" in properties, "the property called title stays"
    assert "Title" not in repr(trimmed)
    assert all(valid(trimmed, v) == valid(SCHEMA, v) for v in VALUES)


def test_the_schemas_given_are_left_unchanged() -> None:
    before = repr(SCHEMA)
    trimmed_output_schema(SCHEMA)
    trimmed_input_schema(SCHEMA)
    assert repr(SCHEMA) == before
