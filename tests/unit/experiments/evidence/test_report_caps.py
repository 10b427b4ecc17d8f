"""A tenant's test report is read within caps: depth, elements, test cases, JSON values,
failing names kept, and memory.

The report is the tenant's: its conftest.py (or test script) may write anything to
``.sandbox-reports/``, up to the 20 MB read. Built into an ElementTree, 20 MB of nested
elements took the server from 121 MB to 1.8 GB; ``json.loads`` of 4 MiB of ``[{},{},...]``
took 81 MB. Past a cap the reading is the counts so far (or, for JSON, the text
summary) with a note naming the cap, never an exception.
"""

from __future__ import annotations

import importlib
import json
import time
import tracemalloc
from typing import Any

import pytest

from app.experiments.evidence.readers import _common
from app.experiments.evidence.readers._common import MAX_JSON_VALUES, MAX_KEPT_FAILING, Tally
from app.experiments.evidence.testing import TestSummary, parse

# The module (the package's ``junit`` is its reader function).
junit = importlib.import_module("app.experiments.evidence.readers.junit")
REPORT_BYTES = 20 * 1024 * 1024  # what read_report reads at most


def cases(count: int, *, failing: bool = False) -> str:
    outcome = "<failure/>" if failing else ""
    case = '<testcase classname="m" name="t{n}">{outcome}</testcase>'
    return "".join(case.format(n=n, outcome=outcome) for n in range(count))


def nested_report(size: int = REPORT_BYTES) -> str:
    """Three passing cases, then elements nested as deep as ``size`` bytes allow (unclosed)."""
    head = f"<testsuites><testsuite>{cases(3)}"
    return head + "<a>" * ((size - len(head)) // 3)


def flat_report(size: int = REPORT_BYTES) -> str:
    """Three passing cases, then as many empty elements as ``size`` bytes allow."""
    head, tail = f"<testsuites><testsuite>{cases(3)}", "</testsuite></testsuites>"
    return head + "<a/>" * ((size - len(head) - len(tail)) // 4) + tail


def notes_naming(summary: TestSummary, cap: str) -> list[str]:
    return [note for note in summary.notes if f"cap {cap}" in note]


@pytest.mark.parametrize(
    ("report", "note"),
    [
        (nested_report, f"nests deeper than {junit.MAX_DEPTH} elements (cap MAX_DEPTH)"),
        (flat_report, f"has more than {junit.MAX_ELEMENTS:,} elements (cap MAX_ELEMENTS)"),
    ],
    ids=["depth", "elements"],
)
def test_a_report_past_a_cap_gives_the_counts_so_far_and_names_the_cap(
    report: Any, note: str
) -> None:
    summary = parse("pytest", "", "", report(), 1)

    assert summary.detected, summary
    assert (summary.passed, summary.total) == (3, 3), summary
    assert [n for n in summary.notes if "(cap " in n] == [
        f"the JUnit XML {note}; read it up to there"
    ], summary.notes


def test_test_cases_past_the_case_cap_are_counted_up_to_it_and_name_the_cap() -> None:
    report = f"<testsuite>{cases(junit.MAX_TEST_CASES + 50, failing=True)}</testsuite>"

    summary = parse("pytest", "", "", report, 1)

    assert summary.failed == junit.MAX_TEST_CASES, summary.failed
    assert summary.failing_tests_truncated
    assert len(notes_naming(summary, "MAX_TEST_CASES")) == 1, summary.notes


def test_a_report_under_the_caps_reads_whole() -> None:
    count = junit.MAX_TEST_CASES  # exactly at the cap: no note
    report = f"<testsuites><testsuite time='2.5'>{cases(count)}</testsuite></testsuites>"

    summary = parse("pytest", "", "", report, 0)

    assert (summary.passed, summary.duration_s) == (count, 2.5), summary
    assert not [note for note in summary.notes if "cap" in note], summary.notes


@pytest.mark.parametrize("report", [nested_report, flat_report], ids=["nested", "flat"])
def test_a_20_mb_hostile_report_is_read_in_bounded_memory(report: Any) -> None:
    text = report()
    tracemalloc.start()
    try:
        summary = parse("pytest", "", "", text, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"\nparsing a {len(text) / 2**20:.0f} MB report: peak {peak / 2**20:.1f} MB allocated")
    assert summary.passed == 3, summary
    # The text's UTF-8 copy (the server reads bytes and makes none) and a few MB; an
    # ElementTree of it took hundreds of MB (1.8 GB of RSS for two reports).
    assert peak < len(text) + 8 * 2**20, f"parsing allocated {peak / 2**20:.0f} MB at its peak"


def test_the_parser_is_fed_in_small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each feed is one stretch of C that holds the GIL (expat held it 65-130 ms for a
    # whole 16 MB report): every feed is at most FEED_BYTES.
    fed: list[int] = []

    class Spy(junit.DefusedExpatParser):  # type: ignore[misc]
        def feed(self, data: Any, isFinal: bool = False) -> None:
            fed.append(len(data))
            super().feed(data, isFinal)

    monkeypatch.setattr(junit, "DefusedExpatParser", Spy)
    report = f"<testsuite>{cases(20_000)}</testsuite>"

    summary = parse("pytest", "", "", report, 0)

    assert summary.passed == 20_000
    assert len(fed) > 1
    assert max(fed) <= junit.FEED_BYTES, max(fed)
    assert sum(fed) == len(report)


def test_a_json_report_of_too_many_values_is_not_loaded_and_names_the_cap() -> None:
    huge = json.dumps({"testResults": [{}] * (MAX_JSON_VALUES + 1)})
    stderr = "Tests:       1 failed, 2 passed, 3 total\n"

    summary = parse("jest", "", stderr, huge, 1)

    assert notes_naming(summary, "MAX_JSON_VALUES") == [
        f"the jest JSON report holds more than {MAX_JSON_VALUES:,} values "
        "(cap MAX_JSON_VALUES); not read"
    ], summary.notes
    assert (summary.failed, summary.passed) == (1, 2), summary  # read the text summary instead


def test_a_json_report_under_the_value_cap_is_loaded() -> None:
    tests = [{"status": "passed"}] * (MAX_JSON_VALUES // 4)
    results = [{"name": "/workspace/a.test.js", "assertionResults": tests}]
    report = json.dumps({"testResults": results})

    assert not _common.json_values_over_cap(report.encode())
    assert parse("jest", "", "", report, 0).passed == len(tests)


def test_a_tally_keeps_a_bounded_number_of_failing_names() -> None:
    tally = Tally("pytest")
    for n in range(MAX_KEPT_FAILING * 3):
        tally.fail(f"t{n}")

    assert tally.failed == MAX_KEPT_FAILING * 3
    assert len(tally.failing) == MAX_KEPT_FAILING
    assert tally.failing_cut


def test_a_report_with_a_wide_character_stays_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # As text, one astral character would make all 20 MB four bytes a character.
    report = f"<testsuite>{cases(2)}<testcase name='\U0001f600'/></testsuite>".encode()
    seen: list[type] = []
    real = junit.junit_text

    def spy(text: str | bytes, runner: str) -> Tally:
        seen.append(type(text))
        return real(text, runner)

    monkeypatch.setattr(junit, "junit_text", spy)

    assert parse("pytest", "", "", report, 0).passed == 3
    assert seen == [bytes], seen


def namespaced_report(size: int = REPORT_BYTES, uri_chars: int = 20_000) -> str:
    """Three passing cases, then small elements of a prefix bound to a long URI."""
    head = f'<testsuites xmlns:a="{"u" * uri_chars}"><testsuite>{cases(3)}'
    tail = "</testsuite></testsuites>"
    return head + "<a:b/>" * ((size - len(head) - len(tail)) // 6) + tail


def wide_tag_report(size: int = REPORT_BYTES) -> str:
    """Three passing cases, then one tag of as many attributes as ``size`` bytes allow."""
    head, tail = f"<testsuites><testsuite>{cases(3)}<a ", "/></testsuite></testsuites>"
    width = len(' b0000000=""')
    return head + "".join(f' b{n:07x}=""' for n in range((size - len(head)) // width)) + tail


def long_value_report(size: int = REPORT_BYTES) -> str:
    """Three passing cases, then one attribute value as long as ``size`` bytes allow."""
    head, tail = f'<testsuites><testsuite>{cases(3)}<a v="', '"/></testsuite></testsuites>'
    return head + "v" * (size - len(head) - len(tail)) + tail


def cpu_s_of(report: str) -> tuple[float, TestSummary]:
    started = time.process_time()
    summary = parse("pytest", "", "", report, 0)
    return time.process_time() - started, summary


@pytest.mark.parametrize(
    ("report", "cap"),
    [
        (namespaced_report, "MAX_ELEMENTS"),
        (wide_tag_report, "MAX_TOKEN_BYTES"),
        (long_value_report, "MAX_TOKEN_BYTES"),
    ],
    ids=["namespace-uri", "many-attributes", "long-attribute"],
)
def test_a_report_costs_no_more_cpu_than_a_flat_one_of_its_size(report: Any, cap: str) -> None:
    # Expat's costs that grow faster than the report: a namespace's URI copied into
    # every name using its prefix (a 20 KB URI: 28 s of CPU for 20 MB), a tag only
    # handed over once whole (1.7 million attributes: 10.8 s and 480 MB; one 19 MB
    # value, read again at each feed: 5.6 s). The floor is measured here: the flat
    # report of the same size, 500,000 elements read.
    floor, _ = cpu_s_of(flat_report())
    spent, summary = cpu_s_of(report())
    print(f"\n{report.__name__}: {spent:.2f} s of CPU; a flat report of its size {floor:.2f} s")
    assert summary.passed == 3, summary
    assert notes_naming(summary, cap), summary.notes
    assert spent < 3 * floor + 0.5, f"{spent:.2f} s of CPU (a flat report: {floor:.2f} s)"


def test_a_tag_just_under_the_token_cap_is_read() -> None:
    value = "m" * (junit.MAX_TOKEN_BYTES - 64 * 1024)
    report = (
        f'<testsuites><testsuite><testcase name="t"><failure message="{value}"/></testcase>'
        f"{cases(2)}</testsuite></testsuites>"
    )
    summary = parse("pytest", "", "", report, 1)
    assert (summary.failed, summary.passed, summary.notes[:1]) == (1, 2, []), summary
