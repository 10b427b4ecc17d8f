"""Benchmark: how long does reading a 10,000-test run take, per format?

    uv run python tests/bench/bench_test_parsing.py [--tests 10000] [--reps 9]

Generates, in memory, the output of a run of ``--tests`` tests with about 1% failing, in the
shape each runner really writes it (compare fixtures/test_outputs in the unit tests):

- ``pytest``: the JUnit XML report of ``--junitxml`` with ``junit_family=xunit1``;
- ``jest``:   the ``--json`` report, 100 tests per file;
- ``go``:     the ``go test -json`` event stream, 100 tests per package, output events included;
- ``node``:   ``node --test --test-reporter=tap``, 100 tests per ``describe``, YAML blocks included.

Prints the median time of ``testing.parse`` for each (target: under 100 ms), checks that
the counts come out right, and, for reference, the median of ``parse_any`` on the same
output (a ``command`` override: the format is recognised, not known).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.experiments.evidence.testing import parse, parse_any

TARGET_MS = 100.0
STACK = "\n".join(f"    at frame{i} (/workspace/src/module.js:{i}:7)" for i in range(8))


@dataclass(frozen=True)
class Case:
    runner: str
    stdout: str
    report: str | None


def failing(i: int) -> bool:
    return i % 100 == 42


def pytest_junit(n: int) -> Case:
    cases = []
    for i in range(n):
        module = f"tests/test_mod{i // 100}.py"
        head = (
            f'<testcase classname="tests.test_mod{i // 100}.TestThing" name="test_{i}" '
            f'file="{module}" line="{i % 100}" time="0.001"'
        )
        if failing(i):
            body = "\n".join(f"E       assert {j} == {j + 1}" for j in range(10))
            cases.append(f'{head}><failure message="assert 1 == 2">{body}</failure></testcase>')
        else:
            cases.append(f"{head} />")
    xml = (
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" '
        f'failures="{n // 100}" skipped="0" tests="{n}" time="12.3">{"".join(cases)}'
        "</testsuite></testsuites>"
    )
    return Case("pytest", f"{n // 100} failed, {n - n // 100} passed in 12.3s\n", xml)


def jest_json(n: int) -> Case:
    files = []
    for f in range(n // 100):
        tests = []
        for i in range(f * 100, f * 100 + 100):
            bad = failing(i)
            tests.append(
                {
                    "ancestorTitles": ["module", f"group {f}"],
                    "duration": 1,
                    "failureDetails": [{}] if bad else [],
                    "failureMessages": [f"Error: expected 1 to be 2\n{STACK}"] if bad else [],
                    "fullName": f"module group {f} does thing {i}",
                    "invocations": 1,
                    "location": None,
                    "numPassingAsserts": 1,
                    "retryReasons": [],
                    "status": "failed" if bad else "passed",
                    "title": f"does thing {i}",
                }
            )
        files.append(
            {
                "assertionResults": tests,
                "endTime": 1_700_000_000_500 + f,
                "message": "",
                "name": f"/workspace/src/mod{f}.test.js",
                "startTime": 1_700_000_000_000 + f,
                "status": "passed",
                "summary": "",
            }
        )
    report = {
        "numFailedTests": n // 100,
        "numPassedTests": n - n // 100,
        "numRuntimeErrorTestSuites": 0,
        "numTotalTests": n,
        "startTime": 1_700_000_000_000,
        "success": False,
        "testResults": files,
    }
    return Case("jest", "", json.dumps(report))


def go_json(n: int) -> Case:
    lines = []

    def event(action: str, package: str, test: str | None = None, **extra: object) -> None:
        data: dict[str, object] = {"Time": "2026-11-29T22:01:23.393345684Z", "Action": action}
        data["Package"] = package
        if test is not None:
            data["Test"] = test
        data.update(extra)
        lines.append(json.dumps(data, separators=(",", ":")))

    for p in range(n // 100):
        package = f"example.com/project/pkg{p}"
        for i in range(p * 100, p * 100 + 100):
            test = f"TestThing{i}"
            event("run", package, test)
            event("output", package, test, Output=f"=== RUN   {test}\n")
            if failing(i):
                event("output", package, test, Output="    thing_test.go:17: got 1 want 2\n")
                event("output", package, test, Output=f"--- FAIL: {test} (0.00s)\n")
                event("fail", package, test, Elapsed=0)
            else:
                event("output", package, test, Output=f"--- PASS: {test} (0.00s)\n")
                event("pass", package, test, Elapsed=0)
        event("output", package, Output=f"FAIL\t{package}\t0.012s\n")
        event("fail", package, Elapsed=0.012)
    return Case("go", "\n".join(lines) + "\n", None)


def node_tap(n: int) -> Case:
    out = ["TAP version 13"]
    for s in range(n // 100):
        out.append(f"# Subtest: suite {s}")
        for k, i in enumerate(range(s * 100, s * 100 + 100), start=1):
            out.append(f"    # Subtest: does thing {i}")
            if failing(i):
                out.append(f"    not ok {k} - does thing {i}")
                out += ["      ---", "      duration_ms: 0.5", "      type: 'test'"]
                out.append("      location: '/workspace/test/a.test.js:6:1'")
                out.append("      failureType: 'testCodeFailure'")
                out += ["      error: 'expected 1 to be 2'", "      code: 'ERR_ASSERTION'"]
                out.append("      stack: |-")
                out += [f"        {line.strip()}" for line in STACK.splitlines()]
                out.append("      ...")
            else:
                out.append(f"    ok {k} - does thing {i}")
                out += ["      ---", "      duration_ms: 0.1", "      type: 'test'", "      ..."]
        out.append("    1..100")
        out.append(f"not ok {s + 1} - suite {s}")
        out += ["  ---", "  duration_ms: 12.5", "  type: 'suite'", "  ..."]
    out.append(f"1..{n // 100}")
    out += [f"# tests {n}", f"# suites {n // 100}", f"# pass {n - n // 100}"]
    out += [f"# fail {n // 100}", "# cancelled 0", "# skipped 0", "# todo 0"]
    out.append("# duration_ms 4321.5")
    return Case("node", "\n".join(out) + "\n", None)


GENERATORS: dict[str, Callable[[int], Case]] = {
    "pytest JUnit XML": pytest_junit,
    "jest JSON": jest_json,
    "go test -json": go_json,
    "node TAP": node_tap,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    print(f"{args.tests} tests, {args.reps} repetitions, medians; target {TARGET_MS:.0f} ms")
    over = False
    for label, generate in GENERATORS.items():
        case = generate(args.tests)
        size = len(case.stdout) + len(case.report or "")
        times, sniffed = [], []
        for _ in range(args.reps):
            start = time.perf_counter()
            summary = parse(case.runner, case.stdout, "", case.report, 1)
            times.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            any_summary = parse_any(case.report or case.stdout, "", 1)
            sniffed.append((time.perf_counter() - start) * 1000)
        fails = args.tests // 100
        assert summary.detected, summary.notes
        assert (summary.passed, summary.failed) == (args.tests - fails, fails), summary
        assert len(summary.failing_tests) == min(fails, 200)
        assert any_summary.failed == fails, any_summary
        median = statistics.median(times)
        over |= median > TARGET_MS
        print(
            f"  {label:<18} {size / 2**20:6.2f} MB  median {median:7.1f} ms  "
            f"(min {min(times):.1f}, max {max(times):.1f});  parse_any "
            f"{statistics.median(sniffed):.1f} ms"
        )
    print("over target" if over else "all under target")


if __name__ == "__main__":
    main()
