"""Issue 12, item 1: one tenant's regex or glob must not freeze the server for everyone.

With Python's ``re``, ``search_sandbox`` with ``(a+)+$`` over a 27-character line
held the GIL for 13.5 s (doubling per character), and the glob
``*a*a*a*a*a*a*b`` did the same to ``collect_artifacts`` over a 60-character
name: ``/health``, every sign-in and every other tenant waited. Here the real
server gets both attacks, much longer than that, while ``/health`` is timed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import tool
from oauth_browser import new_user

pytestmark = pytest.mark.e2e

EVIL_LINE = "a" * 5_000 + "!"  # Python's re: about 2**5000 steps
EVIL_NAME = "a" * 200  # no "b": the glob below can only fail, after C(200, 8) tries in re
EVIL_GLOB = "*a" * 8 + "*b"
# Generous: /health answers in milliseconds, but a busy machine can pause one answer
# for a while; a stalled event loop gives no answer at all (a 5 s timeout, counted).
HEALTH_LIMIT_S = 2.5
CALL_LIMIT_S = 10.0
# The watcher's samples at the least, however quickly the attacks are answered: on a busy
# machine the test's own loop may take only a few in the attacks' time.
MIN_SAMPLES = 5


async def health_latencies(server: RunningServer, stop: asyncio.Event) -> list[float]:
    """Time ``GET /health`` every 50 ms until ``stop`` and ``MIN_SAMPLES`` were taken; a
    timeout counts as its 5 s."""
    latencies: list[float] = []
    async with httpx2.AsyncClient(timeout=5) as http:
        while not stop.is_set() or len(latencies) < MIN_SAMPLES:
            started = time.perf_counter()
            try:
                response = await http.get(f"{server.base_url}/health")
                assert response.status_code in (200, 503), response.text
            except httpx2.TimeoutException:
                pass
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.05)
    return latencies


async def timed(call: Any) -> tuple[float, dict[str, Any] | None]:
    """How long ``call`` took, and its answer (None: no answer within CALL_LIMIT_S)."""
    started = time.perf_counter()
    try:
        result = await asyncio.wait_for(call, CALL_LIMIT_S)
    except TimeoutError:
        result = None
    return time.perf_counter() - started, result


async def test_a_backtracking_regex_and_glob_do_not_stall_the_server(tmp_path: Path) -> None:
    server = start_server(
        tmp_path / "state",
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="2",
        SANDBOX_MCP_QUEUE_WAIT_S="0",
    )
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            mallory = await new_user(http, server.base_url)
            created = await tool(
                http,
                server,
                mallory,
                "create_experiment",
                {
                    "files": {
                        "evil.txt": EVIL_LINE + "\naaaa\n",
                        EVIL_NAME: "x",
                        "aaaaaaaab": "collected",
                    }
                },
            )
            assert not created["is_error"], created
            exp = created["experiment_id"]

            stop = asyncio.Event()
            watcher = asyncio.create_task(health_latencies(server, stop))
            await asyncio.sleep(0.3)  # a few samples before the attack, for comparison
            try:
                search_s, found = await timed(
                    tool(
                        http,
                        server,
                        mallory,
                        "search_sandbox",
                        {"experiment_id": exp, "pattern": "(a+)+$"},
                    )
                )
                collect_s, collected = await timed(
                    tool(
                        http,
                        server,
                        mallory,
                        "collect_artifacts",
                        {"experiment_id": exp, "patterns": [EVIL_GLOB]},
                    )
                )
                await asyncio.sleep(0.3)
            finally:
                stop.set()
                latencies = await watcher

            assert max(latencies) < HEALTH_LIMIT_S, (
                f"/health took up to {max(latencies):.2f} s during the attack "
                f"(search {search_s:.2f} s, collect {collect_s:.2f} s)"
            )
            assert found is not None, f"search_sandbox gave no answer in {CALL_LIMIT_S} s"
            assert not found["is_error"], found
            assert [(m["path"], m["line"]) for m in found["matches"]] == [("evil.txt", 2)]
            assert collected is not None, f"collect_artifacts gave no answer in {CALL_LIMIT_S} s"
            assert not collected["is_error"], collected
            assert [a["path"] for a in collected["artifacts"]] == ["aaaaaaaab"]

            # What RE2 cannot do without backtracking is refused, by name.
            refused = await tool(
                http,
                server,
                mallory,
                "search_sandbox",
                {"experiment_id": exp, "pattern": r"(a)\1"},
            )
            assert refused["is_error"]
            assert refused["error"]["code"] == "INVALID_ARGUMENT"
            assert "backreference" in refused["error"]["message"]
    finally:
        stop_server(server)
