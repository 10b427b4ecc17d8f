"""A tenant's test report cannot take the server's memory, and another tenant's calls go on.

Issue 23, finding 5: a tenant's conftest.py replaces its JUnit report with 20 MB of
nested elements (no entities, which are refused). Built into an ElementTree, two such
reports at once took the server from 121 MB to 1.8 GB. Here mallory runs ``run_tests``
in two sandboxes at once, one report nested 6 million deep and one of 5 million empty
elements, while alice reads a file over and over; the server's peak RSS (VmHWM) must
stay near where it was, and each hostile summary must name the cap it reached.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx2
import pytest
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import tool
from oauth_browser import new_users
from thread_flood import SERVER_ENV, honest_workspace, percentiles, read_small

pytestmark = pytest.mark.e2e

REPORT = "/workspace/.sandbox-reports/pytest.xml"
SIZE = 19 * 1024 * 1024  # under the 20 MB the server reads
# pytest writes its report at the session's end; this runs after, at the interpreter's exit.
CONFTEST = f"""
import atexit

def _replace_the_report():
    head = {{root!r}} + '<testsuite>' + '<testcase classname="m" name="t"/>' * 3
    with open({REPORT!r}, "w") as report:
        report.write(head + {{body!r}} * (({SIZE} - len(head)) // {{width}}))

atexit.register(_replace_the_report)
"""
HOSTILE = {
    "MAX_DEPTH": CONFTEST.format(root="<testsuites>", body="<a>", width=3),
    "MAX_ELEMENTS": CONFTEST.format(root="<testsuites>", body="<a/>", width=4),
}
# Small elements of a prefix bound to a 20 KB URI (expat, processing namespaces, copied
# the URI into each element's name), and one attribute value of 19 MB (expat read the
# unfinished tag again at each feed).
NAMESPACED = CONFTEST.format(root=f'<testsuites xmlns:a="{"u" * 20_000}">', body="<a:b/>", width=6)
LONG_VALUE = CONFTEST.format(root="<testsuites>", body="v", width=1).replace(
    "* 3\n", "* 3 + '<a v=\"'\n"
)
# Generous: the server's own growth while parsing is a few MB; main grew by 1.7 GB.
MAX_GROWTH_MB = 300


async def reporting(
    http: httpx2.AsyncClient, server: RunningServer, token: str, conftest: str
) -> str:
    """A pytest project whose report ``conftest`` replaces; its experiment id."""
    files = {
        "conftest.py": conftest,
        "tests/test_ok.py": "def test_ok():\n    pass\n",
        "pyproject.toml": "[tool.pytest.ini_options]\n",
    }
    created = await tool(http, server, token, "create_experiment", {"files": files})
    assert not created["is_error"], created
    return str(created["experiment_id"])


def cpu_s(pid: int) -> float:
    """The process's CPU time so far, user and system (Linux /proc), in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set size so far (Linux /proc), in MB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


async def test_two_hostile_reports_at_once_leave_the_memory_and_another_tenant_alone(
    tmp_path: Path,
) -> None:
    # The thread flood's server, with a third slot: two of mallory's sandboxes, alice's.
    server = start_server(tmp_path / "state", **{**SERVER_ENV, "SANDBOX_MCP_POOL_SIZE": "3"})
    try:
        async with httpx2.AsyncClient(timeout=300) as http:
            mallory, alice = await new_users(http, server.base_url, 2)
            hostile: dict[str, str] = {}
            for cap, conftest in HOSTILE.items():
                hostile[cap] = await reporting(http, server, mallory, conftest)
            honest = (alice, await honest_workspace(http, server, alice))
            floor = [await read_small(http, server, *honest) for _ in range(5)]
            before_mb = peak_rss_mb(server.process.pid)

            runs = {
                cap: asyncio.create_task(
                    tool(http, server, mallory, "run_tests", {"experiment_id": experiment})
                )
                for cap, experiment in hostile.items()
            }
            during: list[float] = []
            while not all(run.done() for run in runs.values()):
                during.append(await read_small(http, server, *honest))
            after_mb = peak_rss_mb(server.process.pid)

            print(
                f"\nserver peak RSS {before_mb:.0f} MB before, {after_mb:.0f} MB after two "
                f"hostile reports; alice's reads before: {percentiles(floor)}, "
                f"during: {percentiles(during)}"
            )
            for cap, run in runs.items():
                result = run.result()
                assert not result["is_error"], result
                tests = result["tests"]
                assert tests["passed"] == 3, tests
                assert any(f"(cap {cap})" in note for note in tests["notes"]), tests["notes"]
            assert after_mb - before_mb < MAX_GROWTH_MB, (
                f"the server's peak RSS grew from {before_mb:.0f} MB to {after_mb:.0f} MB"
            )
            assert during, "alice made no call while the reports were read"
            # Generous: alice's reads are served meanwhile, not held for seconds.
            assert max(during) < max(floor) + 5, percentiles(during)
    finally:
        stop_server(server)


async def test_a_namespaced_report_costs_the_server_no_more_cpu_than_a_flat_one(
    tmp_path: Path,
) -> None:
    # The floor is measured in the same test: the server's CPU while it reads the flat
    # report of the same size (500,000 elements). Main: 10.5 s for the namespaced
    # one, 3.6 s for the long value, 0.5 s for the flat one.
    server = start_server(tmp_path / "state", **SERVER_ENV)
    try:
        async with httpx2.AsyncClient(timeout=600) as http:
            (mallory,) = await new_users(http, server.base_url, 1)
            spent: dict[str, float] = {}
            results = {}
            for name, conftest in (
                ("flat", HOSTILE["MAX_ELEMENTS"]),
                ("namespaced", NAMESPACED),
                ("long value", LONG_VALUE),
            ):
                experiment = await reporting(http, server, mallory, conftest)
                before = cpu_s(server.process.pid)
                results[name] = await tool(
                    http, server, mallory, "run_tests", {"experiment_id": experiment}
                )
                spent[name] = cpu_s(server.process.pid) - before
                gone = await tool(
                    http, server, mallory, "destroy_experiment", {"experiment_id": experiment}
                )
                assert not gone["is_error"], gone
        print(f"\nthe server's CPU for run_tests: {spent}")
        for name, result in results.items():
            assert not result["is_error"], result
            assert result["tests"]["passed"] == 3, (name, result["tests"])
        assert any("(cap MAX_TOKEN_BYTES)" in n for n in results["long value"]["tests"]["notes"])
        for name in ("namespaced", "long value"):
            assert spent[name] < 3 * spent["flat"] + 2, spent
    finally:
        stop_server(server)
