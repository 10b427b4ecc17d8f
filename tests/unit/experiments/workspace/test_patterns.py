"""Tenant patterns compile to RE2: no backtracking, clear refusals, the old meaning kept."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import re2
from timing import fastest

from app.experiments.workspace import files
from app.experiments.workspace.patterns import (
    MAX_REGEX_LENGTH,
    InvalidPattern,
    compile_glob,
    compile_search,
)

# Each of these takes Python's re longer than the age of the universe on the
# subjects below (the first one: 13.5 s on 27 characters, doubling per character).
CATASTROPHIC = [r"(a+)+$", r"(a|aa)+$", r"(a|a?)+$", r"(.*a){25}$", r"^(\w+\s?)*$", r"(x+x+)+y"]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_catastrophic_regexes_take_milliseconds_on_long_lines(pattern: str) -> None:
    matcher = compile_search(pattern)
    for subject in ("a" * 100_000 + "!", "x" * 100_000, "ab " * 30_000 + "!"):
        assert fastest(lambda s=subject: matcher.search(s), runs=3) < 0.25, (pattern, subject[:10])


def test_search_over_a_file_with_the_attack_line_is_prompt(tmp_path: Path) -> None:
    (tmp_path / "evil.txt").write_text("a" * 200_000 + "!\n" + "aaaa\n")
    result = files.search(tmp_path, r"(a+)+$")
    assert [(m.path, m.line) for m in result.matches] == [("evil.txt", 2)]
    assert fastest(lambda: files.search(tmp_path, r"(a+)+$"), runs=3) < 1.0


def test_catastrophic_globs_take_milliseconds_on_long_names() -> None:
    glob = "*a" * 12 + "*b"
    name = "a" * 4_000
    matcher = compile_glob(glob)
    assert fastest(lambda: matcher.fullmatch(name), runs=3) < 0.05
    assert not matcher.fullmatch(name)
    assert matcher.fullmatch("a" * 12 + "b")
    assert compile_glob("**/" * 100 + "x").fullmatch("d/" * 2_000 + "x")


@pytest.mark.parametrize(
    ("pattern", "named"),
    [
        (r"(a)\1", r"backreference (\1)"),
        (r"(?P<n>a)(?P=n)", "named backreferences"),
        (r"foo(?=bar)", "lookahead"),
        (r"foo(?!bar)", "negative lookahead"),
        (r"(?<=foo)bar", "lookbehind"),
        (r"(?<!foo)bar", "negative lookbehind"),
        (r"(?>a+)b", "atomic groups"),
        (r"a++b", "possessive quantifier"),
        (r"(a)?(?(1)b|c)", "conditionals"),
        (r"(?#note)a", "comments"),
        (r"(?x) a b", "inline flag 'x'"),
        (r"a{1001}", "repetition count over 1000"),
        (r"(?:a{100}){100}", "repetition count over 1000"),
    ],
)
def test_unsupported_syntax_is_named_in_an_invalid_argument(pattern: str, named: str) -> None:
    with pytest.raises(InvalidPattern) as raised:
        compile_search(pattern)
    assert raised.value.code == "INVALID_ARGUMENT"
    assert named in raised.value.message
    assert "not support" in raised.value.message
    assert raised.value.message.endswith(".")


def test_malformed_long_and_oversized_patterns_are_refused_with_a_sentence() -> None:
    with pytest.raises(InvalidPattern, match=r"not a valid regular expression: missing \)"):
        compile_search("(unclosed")
    with pytest.raises(InvalidPattern, match=f"at most {MAX_REGEX_LENGTH} characters"):
        compile_search("a" * (MAX_REGEX_LENGTH + 1))
    # Short, but its automaton would be huge: the memory cap refuses it.
    with pytest.raises(InvalidPattern, match="more than the server allows"):
        compile_search(r"\pL{1000}")


def test_refused_patterns_say_so_in_the_search_tool(tmp_path: Path) -> None:
    with pytest.raises(InvalidPattern, match="lookahead"):
        files.search(tmp_path, "x(?=y)")


def test_compiled_patterns_are_not_kept_by_re2() -> None:
    # re2 caches 128 patterns, each with up to max_mem of automaton; ours are one-off.
    compile_search(r"kept\d+")
    compile_glob("kept/*.log")
    assert re2._Regexp._make.cache_info().currsize == 0


LINES = [
    "def two():",
    "    return 2  # two",
    "Hello World",
    "x = 'é' + \"\\Z\"",
    "a]b",
    "tab\there",
    "xxy",
    "",
    "ünïcödé",
    "line ending",
]
SAME_AS_PYTHON = [
    r"\btwo\b",
    r"(?i)HELLO",
    r"^def \w+\(",
    r"two$",
    r"ending\Z",
    r"\\Z",
    r"[]a]b",
    r"[^]a]b",
    r"x{,2}y",
    r"x{2,}y",
    r"\u00e9",
    r"\t",
    r"(?P<name>o)r",
    r"(?s)l.*g",
    r"(?m)^H",
    r"é",
    r"\d",
    r"[[:alpha:]]",
    r"^$",
    r"W.rld|^ü",
]


@pytest.mark.parametrize("pattern", SAME_AS_PYTHON)
def test_ordinary_patterns_match_the_lines_python_matched(pattern: str) -> None:
    matcher = compile_search(pattern)
    python = re.compile(pattern.replace("[[:alpha:]]", "[a-zA-Z]"))  # RE2's POSIX class
    assert [matcher.search(line) for line in LINES] == [bool(python.search(line)) for line in LINES]


def test_search_semantics_unchanged(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("import os\nCONFIG = 1\nconfig = 2\n")
    hits = files.search(tmp_path, r"(?i)^config")
    assert [m.line for m in hits.matches] == [2, 3]
    assert [m.line for m in files.search(tmp_path, r"^config").matches] == [3]
    assert len(files.search(tmp_path, r"o", max_results=1).matches) == 1


def test_the_time_budget_is_checked_between_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "many.txt").write_text("hit\n" * 1_000)
    clock = iter(range(10_000))  # one second per look at the clock
    monkeypatch.setattr(files.time, "monotonic", lambda: float(next(clock)))
    result = files.search(tmp_path, "hit", max_results=2_000)
    assert result.truncated
    assert 0 < len(result.matches) <= files.SEARCH_BUDGET_S + 1


@pytest.mark.parametrize(
    ("glob", "path", "matches"),
    [
        ("a+b(1).txt", "a+b(1).txt", True),
        ("a+b(1).txt", "aab(1).txt", False),
        ("[x].log", "[x].log", True),
        ("[x].log", "x.log", False),
        ("out dir/*.txt", "out dir/a b.txt", True),
        ("out/?.txt", "out/é.txt", True),
        ("out/?.txt", "out/ab.txt", False),
        ("**/*.log", "deep/er/x.log", True),
        ("*.log", "deep/x.log", False),
        ("out/**", "out/line\nbreak", True),
        ("*.txt", "line\nbreak.txt", True),
        ("$^.txt", "$^.txt", True),
    ],
)
def test_glob_characters_other_than_wildcards_are_literal(
    glob: str, path: str, matches: bool
) -> None:
    assert compile_glob(glob).fullmatch(path) is matches


def test_names_that_are_not_utf8_still_match_one_character_per_byte_escape() -> None:
    name = os.fsdecode(b"out/a\xffb.txt")  # a lone surrogate, as the jail's walk gives it
    assert compile_glob("out/a?b.txt").fullmatch(name)
    assert compile_glob("out/*.txt").fullmatch(name)
    assert compile_search("a.b").search(name)
    assert compile_glob("\udcff").fullmatch("\udcff")  # from JSON: no crash either
