"""A test run's report, up to 20 MB of the tenant's, is parsed off the event loop.

``CommandRunner._summarize`` (app/experiments/commands.py) read the report in the
caller's thread share, then called ``testing.parse`` (JUnit XML through ElementTree,
jest/vitest JSON, regexes over the output) directly in the coroutine: every other
call of every tenant waited while it ran (428 ms for 16 MB). The tenant controls
the report (its test command writes ``.sandbox-reports/pytest.xml``; read up to
20 MB) and the stdout and stderr it is matched against (1 MB each), and can run
``run_tests`` four at a time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from app.experiments.commands import CommandRunner
from app.experiments.evidence import testing
from app.runtime.backend import ExecResult
from app.tenancy.threads import TenantThreads


def junit_report(cases: int) -> str:
    body = "".join(
        f'<testcase classname="tests.test_m" name="test_{n}" file="tests/test_m.py" time="0.001">'
        f'<failure message="boom {n}">{"x" * 200}</failure></testcase>'
        for n in range(cases)
    )
    suite = f'<testsuite name="pytest" tests="{cases}">{body}</testsuite>'
    return f'<?xml version="1.0"?><testsuites>{suite}</testsuites>'


async def longest_gap(stop: asyncio.Event) -> float:
    """The longest the loop went without running this task, until ``stop``."""
    longest, last = 0.0, time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.005)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    return longest


async def test_the_report_is_parsed_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "workspace"
    (workspace / testing.REPORT_DIR).mkdir(parents=True)
    report = junit_report(50_000)  # about 18 MB, under the 20 MB read
    (workspace / testing.REPORT_DIR / "pytest.xml").write_text(report)
    plan = testing.TestPlan("pytest", "python3 -m pytest", f"{testing.REPORT_DIR}/pytest.xml")

    parsed_on: list[threading.Thread] = []
    took: list[float] = []
    real_parse = testing.parse

    def spy(*args: Any) -> Any:
        parsed_on.append(threading.current_thread())
        started = time.perf_counter()
        try:
            return real_parse(*args)
        finally:
            took.append(time.perf_counter() - started)

    monkeypatch.setattr(testing, "parse", spy)
    threads = TenantThreads(total=2, per_sandbox=1)
    result = ExecResult(1, "", "", False, False, 1.0)
    stop = asyncio.Event()
    ticker = asyncio.create_task(longest_gap(stop))
    await asyncio.sleep(0.02)
    summary = await CommandRunner._summarize(
        (workspace, plan, threads.for_sandbox("mallory")), result
    )
    stop.set()
    gap = await ticker
    assert summary["failed"] == 50_000, summary
    print(
        f"\nparsing the {len(report) / 2**20:.0f} MB report took {took[0] * 1000:.0f} ms; "
        f"the loop's longest gap meanwhile: {gap * 1000:.0f} ms"
    )
    # The test runs on the loop, in the main thread.
    assert parsed_on[0] is not threading.main_thread(), (
        f"the tenant's report was parsed on the event loop's thread for {took[0] * 1000:.0f} ms"
    )
