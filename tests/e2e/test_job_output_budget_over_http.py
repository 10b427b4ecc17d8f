"""One sandbox's stored job output is bounded by its daily budget, across server
processes, while every result reaches the agent whole (issue 23's sweep).

Each job keeps up to 1 MB a stream in the database every tenant shares, for as long
as its experiment lives: mallory, looping a command that prints about 1 MB, used to
fill that disk. Here two server processes share one PostgreSQL with a budget of
BUDGET bytes a sandbox a day; mallory runs JOBS such commands, two at a time, one on
each process. Every result counts the whole output and shows its end; once the
budget is spent each result says its output is not kept, and the database (read
directly) holds at most the budget for mallory plus a tail per job. alice, honest,
runs one such command after mallory's flood: it is kept whole.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import sqlalchemy as sa
from db_testkit import fresh_postgres_blocking
from e2e_server import RunningServer, Servers, free_port
from mcp_http import run_command, tool
from oauth_browser import new_users
from sqlalchemy.ext.asyncio import create_async_engine

from app.experiments.output_budget import CEILING, COMMAND_KEPT_CHARS, JOB_ROW_BYTES, TAIL_CHARS

pytestmark = pytest.mark.e2e

BUDGET = 3 * 1_048_576  # SANDBOX_MCP_JOB_OUTPUT_BYTES_PER_SANDBOX_PER_DAY, set below
OUTPUT = 1_000_000  # under the 1 MB a stream a job keeps
JOBS = 10


def loud(n: int) -> str:
    """A command printing OUTPUT bytes and then a line naming it."""
    return f"head -c {OUTPUT} /dev/zero | tr '\\0' x; echo; echo END{n}"


@dataclass
class Pair:
    servers: list[RunningServer]
    database_url: str


@pytest.fixture
def pair(serve: Servers, tmp_path: Path) -> Iterator[Pair]:
    port = free_port()
    with fresh_postgres_blocking() as url:
        env = {
            # One public URL: a token is for it, whichever process is asked.
            "SANDBOX_MCP_PUBLIC_URL": f"http://127.0.0.1:{port}",
            "SANDBOX_MCP_DATABASE_URL": url,
            "SANDBOX_MCP_AUTH": "oauth",
            "SANDBOX_MCP_POOL_SIZE": "2",
            "SANDBOX_MCP_JOB_OUTPUT_BYTES_PER_SANDBOX_PER_DAY": str(BUDGET),
        }
        running: list[RunningServer] = []
        try:  # one after the other: the first migrates the schema
            running.append(serve(port=port, **env))
            running.append(serve(state_dir=tmp_path / "state", **env))
            yield Pair(running, url)
        finally:  # before their database goes
            for server in running:
                serve.stop(server)


async def stored(url: str, experiment_id: str) -> tuple[int, int]:
    """(bytes, jobs) the database holds of an experiment's jobs' commands and output."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            row = (
                await connection.execute(
                    sa.text(
                        "SELECT coalesce(sum(octet_length(command) + octet_length(stdout)"
                        " + octet_length(stderr)), 0), count(*) FROM jobs"
                        " WHERE experiment_id = :e"
                    ),
                    {"e": experiment_id},
                )
            ).one()
            return int(row[0]), int(row[1])
    finally:
        await engine.dispose()


async def test_one_sandbox_s_stored_output_stays_within_its_daily_budget(
    http: httpx2.AsyncClient, pair: Pair
) -> None:
    first, second = pair.servers
    mallory, alice = await new_users(http, first.base_url, 2)
    created = await tool(http, first, mallory, "create_experiment", {"name": "loud"})
    assert not created["is_error"], created
    exp = created["experiment_id"]

    results: list[dict[str, Any]] = []
    for n in range(0, JOBS, 2):  # two at a time, one on each process
        results += await asyncio.gather(
            run_command(http, first, mallory, exp, loud(n)),
            run_command(http, second, mallory, exp, loud(n + 1)),
        )
    for n, result in enumerate(results):
        assert result.get("status") == "completed", result
        # Returned whole: the whole length counted, its end shown.
        assert result["stdout_chars"] == OUTPUT + len(f"\nEND{n}\n"), result
        assert result["stdout"].endswith(f"END{n}\n")
    not_kept = [n for n, r in enumerate(results) if r["output_not_kept"]]
    kept = [n for n, r in enumerate(results) if not r["output_not_kept"]]
    print(f"\nkept whole: {len(kept)}, tails only: {len(not_kept)} of {JOBS}")
    texts = len(loud(0)) + OUTPUT + len("\nEND0\n")  # command and stdout, no stderr
    assert len(kept) == BUDGET // (JOB_ROW_BYTES + texts)  # as many as fit, across both processes
    for n in not_kept:  # and the agent was told
        assert any("daily storage budget" in note for note in results[n]["notes"]), results[n]
    for n in kept:
        assert not any("storage budget" in note for note in results[n]["notes"]), results[n]

    # Later, through either process, the record says what it kept: the tail.
    n = not_kept[0]
    later = await tool(http, second, mallory, "get_job_result", {"job_id": results[n]["job_id"]})
    assert (later["output_not_kept"], later["stdout_chars"]) == (True, TAIL_CHARS), later
    assert later["stdout"].endswith(f"END{n}\n")

    # alice's output is hers to keep: another sandbox, another budget.
    mine = await tool(http, second, alice, "create_experiment", {"name": "honest"})
    honest = await run_command(http, second, alice, mine["experiment_id"], loud(99))
    assert (honest["status"], honest["output_not_kept"]) == ("completed", False), honest

    mallory_bytes, mallory_jobs = await stored(pair.database_url, exp)
    alice_bytes, _ = await stored(pair.database_url, mine["experiment_id"])
    print(f"stored: mallory {mallory_bytes:,} bytes in {mallory_jobs} jobs, alice {alice_bytes:,}")
    assert mallory_jobs == JOBS
    tails = len(not_kept) * (2 * TAIL_CHARS + COMMAND_KEPT_CHARS)
    assert mallory_bytes <= BUDGET + tails
    assert mallory_bytes < JOBS * OUTPUT / 2  # without the budget: all JOBS whole
    assert alice_bytes == len(loud(99)) + OUTPUT + len("\nEND99\n")  # whole


SMALL = 65_536  # the least budget the setting takes


def both_streams(n: int) -> str:
    """A command printing OUTPUT bytes on stdout and on stderr, then its number."""
    return f"head -c {OUTPUT} /dev/zero | tr '\\0' x | tee /dev/stderr; echo END{n}"


async def test_past_the_ceiling_no_job_starts_and_the_rows_stop_growing(
    http: httpx2.AsyncClient, serve: Servers
) -> None:
    """The tails past the budget are counted too: at CEILING times the budget the
    sandbox's next job is refused until the day ends, so the bytes it stores a day
    are bounded however it spends them (here: every job cut to its tails)."""
    server = serve(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="2",
        SANDBOX_MCP_JOB_OUTPUT_BYTES_PER_SANDBOX_PER_DAY=str(SMALL),
    )
    try:
        mallory, alice = await new_users(http, server.base_url, 2)
        created = await tool(http, server, mallory, "create_experiment", {"name": "loud"})
        exp = created["experiment_id"]
        refused: dict[str, Any] | None = None
        ran = 0
        cut_job = JOB_ROW_BYTES + len(both_streams(0)) + 2 * TAIL_CHARS
        for n in range(CEILING * SMALL // cut_job + 2):  # bounded: each adds a cut record
            result = await run_command(http, server, mallory, exp, both_streams(n))
            if result["is_error"]:
                refused = result
                break
            ran += 1
            assert result["output_not_kept"], result  # 2 MB never fit in 64 KiB
            assert result["stdout_chars"] == OUTPUT + len(f"END{n}\n"), result
        assert refused is not None, f"{ran} jobs ran, none refused"
        assert refused["error"]["code"] == "LIMIT_REACHED", refused
        assert refused["error"]["limit"] == "job_output_per_day", refused
        assert "UTC day ends" in refused["error"]["message"]
        print(f"\n{ran} jobs ran before the ceiling; refused: {refused['error']['message']}")
        mine = await tool(http, server, alice, "create_experiment", {"name": "honest"})
        # Another sandbox runs on, its small output kept (1 MB would not fit in SMALL).
        honest = await run_command(http, server, alice, mine["experiment_id"], "echo honest")
        assert (honest["status"], honest["output_not_kept"]) == ("completed", False), honest
        assert honest["stdout"] == "honest\n"
    finally:  # its database is read whole below, by this process alone
        serve.stop(server)
    assert server.state_dir is not None
    with sqlite3.connect(server.state_dir / "sandbox-mcp.db") as db:
        texts, jobs = db.execute(
            "SELECT sum(length(CAST(command AS BLOB)) + length(CAST(stdout AS BLOB))"
            " + length(CAST(stderr AS BLOB))), count(*) FROM jobs WHERE experiment_id = ?",
            (exp,),
        ).fetchone()
    print(f"stored for mallory: {texts:,} bytes of text in {jobs} jobs")
    assert jobs == ran
    assert texts + jobs * JOB_ROW_BYTES < CEILING * SMALL + cut_job
