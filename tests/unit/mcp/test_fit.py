"""The net under every result: it shrinks what is over budget, says so, keeps the shape."""

from __future__ import annotations

import json

import pytest

from app.mcp.envelope import ToolOutput, ok_result
from app.mcp.fit import STRUCTURED_BUDGET, fit


def size(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def test_a_result_under_budget_is_left_alone() -> None:
    result = {"path": "a.txt", "content": "x" * 100, "notes": []}
    assert fit(result, budget=1000) == []
    assert result == {"path": "a.txt", "content": "x" * 100, "notes": []}


def test_the_largest_list_loses_entries_until_it_fits() -> None:
    result = {
        "matches": [{"path": f"f{n}.py", "line": n, "text": "y" * 80} for n in range(1000)],
        "pattern": "y",
        "notes": ["kept"],
    }
    notes = fit(result, budget=10_000)
    assert size(result) <= 10_000
    assert 0 < len(result["matches"]) < 1000
    assert result["matches"][0]["path"] == "f0.py"  # the first ones stay
    assert result["notes"] == ["kept"]  # never cut
    (note,) = notes
    assert f"`matches` keeps {len(result['matches'])} of its 1000 entries" in note


def test_a_long_string_keeps_its_head_and_its_end() -> None:
    content = "START" + "m" * 200_000 + "THE END"
    result = {"content": content, "notes": []}
    (note,) = fit(result, budget=20_000)
    assert size(result) <= 20_000
    assert result["content"].startswith("START")
    assert result["content"].endswith("THE END")
    assert "characters cut to fit the client's window" in result["content"]
    assert "`content` keeps" in note
    assert "of its 200012 characters" in note


def test_nested_fields_are_found_and_named() -> None:
    result = {"page": {"text": "z" * 50_000}, "jobs": [{"stdout": "s" * 40_000}], "notes": []}
    notes = fit(result, budget=15_000)
    assert size(result) <= 15_000
    assert any("`page.text`" in n for n in notes)
    assert any("`jobs.0.stdout`" in n for n in notes)


def test_a_huge_result_is_measured_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It runs on the event loop: thousands of entries must not mean thousands of
    serializations of the whole (that held the loop for seconds)."""
    from app.mcp import fit as fit_module

    calls = 0
    real = fit_module._size

    def counting(value: object) -> int:
        nonlocal calls
        calls += 1
        return real(value)

    monkeypatch.setattr(fit_module, "_size", counting)
    result = {
        "entries": [
            {"path": f"dir/file-{n:05d}.txt", "kind": "file", "size": n} for n in range(5000)
        ],
        "notes": [],
    }
    fit(result, budget=10_000)
    assert size(result) <= 10_000
    assert calls < 100


class _Record(ToolOutput):
    text: str


@pytest.mark.parametrize("size", [10, STRUCTURED_BUDGET - 60, STRUCTURED_BUDGET - 5, 30_000])
def test_a_wrapped_record_is_cut_only_past_the_budget_and_its_text_is_its_json(
    size: int,
) -> None:
    """Each side of the one-serialization path: a small record, one whose envelope
    leaves no room to spare (checked the long way), one just fitting, one cut."""
    bare = len(json.dumps(_Record(text="").model_dump(mode="json"), separators=(",", ":")))
    record = _Record(text="x" * (size - bare), notes=["own"])
    result = ok_result(record, notes=["first"], idle_expiry_s=600)
    structured = result.structured_content
    assert structured is not None
    cut = size > STRUCTURED_BUDGET
    assert len(structured["text"]) < size - bare if cut else structured["text"] == record.text
    assert structured["notes"][:2] == ["first", "own"]
    assert len(structured["notes"]) == (3 if cut else 2)
    assert structured["idle_expiry_s"] == 600
    body = json.dumps(structured, separators=(",", ":"), ensure_ascii=False)
    notes = [f"Note: {note}" for note in structured["notes"]]
    assert result.content[0].text == "\n".join([*notes, body])  # type: ignore[union-attr]


def test_a_string_of_escapes_keeps_as_much_as_fits_not_nothing() -> None:
    """A quote, a backslash or a control character takes two to six characters of JSON:
    the cut counted them as one, and a file of them was cut to nothing."""
    line = 'quote " back \\ tab \t bell \x07 é 你好\n'
    for content in (line * 30_000, "\x01" * 200_000, '"' * 100_000 + "THE END"):
        result = {"content": content, "notes": []}
        (note,) = fit(result, budget=20_000)
        assert 15_000 <= size(result) <= 20_000, size(result)
        assert "`content` keeps" in note
    assert result["content"].endswith("THE END")


def test_non_ascii_text_is_measured_in_bytes_as_a_client_pays_for_it_in_tokens() -> None:
    """A CJK character is about one token where four ASCII ones are: counted in
    characters, a diff of it took three times the tokens of an ASCII one (48,527
    characters came to 226 KB as sent). The budget is in bytes of UTF-8 JSON."""
    for content in ("你好世界" * 20_000, "é" * 50_000, "a" * 100_000):
        result = {"content": content, "notes": []}
        (note,) = fit(result, budget=20_000)
        in_bytes = len(json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode())
        assert 15_000 <= in_bytes <= 20_000, (content[:1], in_bytes)
        assert "`content` keeps" in note
    # Just under the budget in characters but three times over in bytes: cut.
    wide = {"content": "你" * 10_000, "notes": []}
    assert fit(wide, budget=20_000)
    assert len(wide["content"]) < 7_000
