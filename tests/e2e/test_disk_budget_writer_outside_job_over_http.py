"""A writer that leaves its job is still measured, and stopped near the dir slot's budget.

A command that kills its own supervisor W by pid ends its job at once and hands what
it still runs to the container's PID 1, where no job tracks it (app/runtime/exec/process_tree.py).
The disk budget (app/experiments/disk_budget.py) therefore does not stop measuring a
sandbox when its jobs end: it measures it every DISK_CHECK_INTERVAL_S while its
containers live, and past the budget kills every process of the sandbox user in them,
so the writer outside any job is stopped near the budget instead of filling the
host's filesystem until the idle timeout. Before, the sandbox was let go at its first
measurement without growth: a writer that paused for one interval, then wrote, was
never measured again while only read-only calls followed (issue 23, finding 6).

The stop may not depend on anything the sandbox controls: its command executor runs
as the sandbox user, so the tenant can stop it. A kill sent through it then never
came (the fairness bench saw it fail 4 times in 6 under load: the kill froze and
killed the executor under itself); the kill is now a ``docker exec`` of its own.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx2
import pytest
from disk_budget_testkit import (
    BUDGET_MB,
    SLACK_MB,
    code_of,
    new_experiment,
    slots_mb,
    start_budget_server,
)
from e2e_server import stop_server
from mcp_http import run_command, tool, write_file
from oauth_browser import new_user

pytestmark = pytest.mark.e2e

WRITE_MB = 160  # at about 20 MB/s: 8 s, sixteen check intervals
QUIET_S = 4.0  # eight check intervals without growth: the writer is stopped
PAUSE_S = 3.0  # six check intervals: the sandbox shows no growth, then it grows


# Sends SIGSTOP to the container's command executors (app/runtime/exec/protocol.py): their
# command line names "smcp-executor", spelt here in two halves so that the writer's own
# shell, whose command line holds this text, is not taken for one.
STOP_EXECUTORS = (
    "x=smcp-; x=${x}executor; for p in /proc/[0-9]*; do "
    'grep -qs "$x" $p/cmdline && kill -STOP ${p#/proc/}; done; '
)


def escape(pause_s: float, stop_executors: bool = False) -> str:
    """A writer detached from the job that waits ``pause_s`` then writes WRITE_MB (a file
    a MB: RLIMIT_FSIZE stops only one file at the budget), then the job's supervisor W
    (the command's parent) killed: the job ends at once, the writer runs on under the
    container's PID 1. With ``stop_executors``, the writer stops the container's
    executor before it writes (once the job's end was reported through it) and every
    one started since each 8 MB."""
    stop = STOP_EXECUTORS if stop_executors else ""
    again = f"[ $((i % 8)) -eq 7 ] && {{ {STOP_EXECUTORS}}}; " if stop_executors else ""
    return (
        f"( sleep {pause_s}; {stop}i=0; while [ $i -lt {WRITE_MB} ]; do {again}"
        "head -c 1048576 /dev/zero > f$i; i=$((i+1)); sleep 0.05; done; touch done ) "
        "</dev/null >/dev/null 2>&1 & sleep 0.2; kill -9 $PPID"
    )


async def escape_and_watch(tmp_path: Path, pause_s: float, stop_executors: bool = False) -> None:
    state = tmp_path / "state"
    server = start_budget_server(state, pool_size=2)
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            mallory = await new_user(http, server.base_url)
            exp = await new_experiment(http, server, mallory)
            ran = await run_command(http, server, mallory, exp, escape(pause_s, stop_executors))
            assert ran["status"] in ("completed", "failed"), ran  # the job is over
            status = await tool(http, server, mallory, "get_job_status", {"job_id": ran["job_id"]})
            assert status["status"] != "running", status

            # Bounded wait: until the writer says it finished, or the slot has not grown
            # for QUIET_S after it started to (a stopped writer never finishes). Reading
            # is no writing call: it measures nothing.
            start_mb = last = slots_mb(state)
            quiet_since = time.monotonic()
            for _ in range(240):
                done = await tool(
                    http,
                    server,
                    mallory,
                    "read_sandbox_file",
                    {"experiment_id": exp, "path": "done"},
                )
                if not done["is_error"]:
                    break
                now_mb = slots_mb(state)
                if now_mb != last:
                    last, quiet_since = now_mb, time.monotonic()
                elif last > start_mb and time.monotonic() - quiet_since >= QUIET_S:
                    break
                await asyncio.sleep(0.5)
            used = slots_mb(state)
            print(f"slot after the writer: {used:.1f} MB, budget {BUDGET_MB} MB")
            assert used < BUDGET_MB + SLACK_MB, (
                f"the slot holds {used:.0f} MB against a budget of {BUDGET_MB} MB: "
                "the writer outside any job was never measured or stopped"
            )
            assert done["is_error"], "the writer outside any job wrote all it meant to"
            refused = await write_file(http, server, mallory, exp, "more", "x")
            assert code_of(refused) == "QUOTA_EXCEEDED", refused
    finally:
        stop_server(server)


async def test_a_writer_that_leaves_its_job_is_still_stopped_near_the_budget(
    tmp_path: Path,
) -> None:
    await escape_and_watch(tmp_path, pause_s=0)


async def test_a_writer_that_leaves_its_job_and_pauses_is_still_stopped_near_the_budget(
    tmp_path: Path,
) -> None:
    await escape_and_watch(tmp_path, pause_s=PAUSE_S)


async def test_a_writer_that_stops_the_sandbox_executor_is_still_stopped_near_the_budget(
    tmp_path: Path,
) -> None:
    """The executor is the tenant's to stop: the budget's kill must not need it."""
    await escape_and_watch(tmp_path, pause_s=1.0, stop_executors=True)
