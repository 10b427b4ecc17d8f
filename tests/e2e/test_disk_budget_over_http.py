"""A tenant filling its dir slot is stopped near its byte budget (issue 12).

dir slots have no kernel quota: before, one command could fill the filesystem
that also holds the SQLite database. The server now measures each slot (allocated
blocks, so sparse files count what they hold) and, past the budget, kills the
sandbox's commands (detached ones too) and refuses its writing calls with
QUOTA_EXCEEDED, while other tenants and the database carry on.
"""

from __future__ import annotations

from pathlib import Path

import httpx2
from disk_budget_testkit import (
    BUDGET_MB,
    SLACK_MB,
    code_of,
    new_experiment,
    slots_mb,
    start_budget_server,
)
from e2e_server import stop_server
from mcp_http import job_end, run_command, tool, write_file
from oauth_browser import new_users

# About 20 MB/s, a file a MB (RLIMIT_FSIZE stops one file at the budget). (A process
# detached from its job with setsid dies with the job: app/runtime/exec/process_tree.py.)
WRITER = "i=0; while :; do head -c 1048576 /dev/zero > {name}$i; i=$((i+1)); sleep 0.05; done"


async def test_a_tenant_filling_its_dir_slot_is_stopped_near_its_budget(tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = start_budget_server(state, pool_size=3)
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            alice, bob = await new_users(http, server.base_url, 2)
            exp = await new_experiment(http, server, alice)

            # A sparse file holds nothing: it is not counted (and from_experiment keeps it so).
            sparse = await run_command(http, server, alice, exp, "truncate -s 10G sparse; echo ok")
            assert sparse["stdout"] == "ok\n", sparse
            wrote = await write_file(http, server, alice, exp, "note.txt", "fine")
            assert not wrote["is_error"], wrote

            # A writer inside a job: the job is killed once the slot is over the budget.
            job = await run_command(
                http, server, alice, exp, WRITER.format(name="a"), background=True
            )
            # Its end, however long the writes take on a busy machine (one result
            # wait is at most 45 s).
            ended = await job_end(http, server, alice, job["job_id"])
            assert ended.get("status") in ("cancelled", "failed"), ended
            assert BUDGET_MB <= slots_mb(state) < BUDGET_MB + SLACK_MB

            refused = await run_command(http, server, alice, exp, "echo again")
            assert code_of(refused) == "QUOTA_EXCEEDED", refused
            assert "destroy_experiment" in refused["error"]["message"]
            refused = await write_file(http, server, alice, exp, "more.txt", "x")
            assert code_of(refused) == "QUOTA_EXCEEDED", refused

            # Another tenant and the database carry on meanwhile.
            other = await new_experiment(http, server, bob)
            ran = await run_command(http, server, bob, other, "echo bob")
            assert ran["stdout"] == "bob\n", ran
            assert (await http.get(f"{server.base_url}/health")).status_code == 200

            # Destroying frees the space; then one command past the budget, at once,
            # is caught by the measurement after the command (two files: one file stops
            # at the budget, and fallocate is refused: test_disk_budget_fallocate_over_http).
            gone = await tool(http, server, alice, "destroy_experiment", {"experiment_id": exp})
            assert not gone["is_error"], gone
            exp = await new_experiment(http, server, alice)
            twice = "head -c 24M /dev/zero > f && head -c 24M /dev/zero > g && echo ok"
            big = await run_command(http, server, alice, exp, twice)
            assert big["stdout"] == "ok\n", big
            refused = await run_command(http, server, alice, exp, "echo again")
            assert code_of(refused) == "QUOTA_EXCEEDED", refused
    finally:
        stop_server(server)
