"""Worked demo 1: money in floats, three fixes in three experiments, one recommendation.

Driven through the MCP tools over HTTP as an agent would, on the real Docker daemon.
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from e2e_server import RunningServer, Servers
from mcp_http import tool
from oauth_browser import new_user

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).parents[2] / "examples" / "billing"


def project_files() -> dict[str, str]:
    return {
        str(path.relative_to(EXAMPLE)): path.read_text()
        for path in EXAMPLE.rglob("*.py")
        if "fixes" not in path.parts
    }


@pytest.fixture
def server(serve: Servers) -> RunningServer:
    return serve(SANDBOX_MCP_AUTH="oauth", SANDBOX_MCP_POOL_SIZE="2")


async def test_three_fixes_and_a_recommendation(server: RunningServer) -> None:
    async with httpx2.AsyncClient(timeout=120) as http:
        token = await new_user(http, server.base_url)
        results: dict[str, dict[str, object]] = {}
        ids: dict[str, str] = {}
        for fix in ("rounding", "decimal", "truncation"):
            created = await tool(
                http,
                server,
                token,
                "create_experiment",
                {"name": fix, "goal": "money right to the cent", "files": project_files()},
            )
            assert not created["is_error"], created
            ids[fix] = created["experiment_id"]
            before = await tool(http, server, token, "run_tests", {"experiment_id": ids[fix]})
            assert before["tests"]["runner"] == "pytest"
            assert (before["tests"]["failed"], before["tests"]["passed"]) == (3, 3)
            assert (
                "tests/test_billing.py::test_split_adds_up_exactly"
                in before["tests"]["failing_tests"]
            )
            written = await tool(
                http,
                server,
                token,
                "write_sandbox_file",
                {
                    "experiment_id": ids[fix],
                    "path": "billing.py",
                    "content": (EXAMPLE / "fixes" / f"{fix}.py").read_text(),
                },
            )
            assert not written["is_error"], written
            after = await tool(http, server, token, "run_tests", {"experiment_id": ids[fix]})
            results[fix] = after["tests"]
        assert [results[f]["failed"] for f in ("rounding", "decimal", "truncation")] == [1, 0, 2]

        changes = await tool(
            http,
            server,
            token,
            "inspect_changes",
            {"experiment_id": ids["decimal"], "include_diff": True},
        )
        assert [c["path"] for c in changes["modified"]] == ["billing.py"]
        assert changes["created"] == []
        assert changes["deleted"] == []
        assert "+from decimal import ROUND_HALF_UP, Decimal" in changes["diff"]

        # A destroyed experiment stays comparable: its findings were recorded first.
        await tool(http, server, token, "destroy_experiment", {"experiment_id": ids["truncation"]})
        comparison = await tool(
            http, server, token, "compare_experiments", {"experiment_ids": list(ids.values())}
        )
        assert comparison["recommended"] == ids["decimal"]
        assert "fewest failing tests (0 of 6" in comparison["reason"]
        by_name = {e["name"]: e for e in comparison["experiments"]}
        assert by_name["truncation"]["state"] == "DESTROYED"
        assert by_name["truncation"]["tests_failed"] == 2
        assert by_name["rounding"]["failing_tests"] == [
            "tests/test_billing.py::test_split_adds_up_exactly"
        ]
        assert by_name["decimal"]["lines_changed"] > 0
