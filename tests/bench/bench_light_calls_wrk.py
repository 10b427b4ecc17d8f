"""Benchmark: light tool calls per second measured from outside with ``wrk``, beside the
bare SDK's floor in the same run.

Prints figures, asserts nothing. ``bench_light_calls.py`` drives the servers from a
Python client, which on a small machine takes a large share of the CPU the servers
compete for; here ``wrk`` (C, two threads, 16 connections) sends the same request
over and over, as a busy client would:

1. the bare SDK server (``_bare_sdk_server.py``: one echo tool, no auth, no audit);
2. our server, ``sandbox_status`` with a bearer token (OAuth check, the runner,
   the envelope, the audit row, metrics), on dir slots.

Both are 2026-07-28 requests: a stateless ``POST /mcp`` ``tools/call`` with the
``MCP-Protocol-Version`` header. Both servers run side by side for the whole run and
are measured in alternating rounds; the figures are the medians of the rounds. Each
line also gives the server process's CPU time per call (``/proc``), which follows the
machine's other load much less than calls/s do. After the run the audit table is
counted against the calls ``wrk`` had answered: every answered call has its row.

The per-sandbox day's audit rows (``SANDBOX_MCP_AUDIT_ROWS_PER_SANDBOX_PER_DAY``,
100,000 by default) would be spent by a run of this pace, after which calls are
counted instead of written (a cheaper path): the bench raises it so that every call
writes its row, the path being measured.

``--also DIR`` measures one more of our servers in the same run, started from another
checkout of this repository (``git archive <commit> | tar -x -C DIR``; the same
virtual environment): a change's before and after, beside the same floor.

Needs ``wrk`` on the PATH (Debian/Ubuntu: ``apt-get install -y wrk``; CI does not run
benchmarks, so CI does not install it):

    uv run python tests/bench/bench_light_calls_wrk.py [--rounds 5] [--seconds 5] [--also DIR]

Figures (2-core development machine, 2026-12-06, measured while a CI run with four
busy processes shared it, load 9-13: no quiet window came; medians of 5 rounds of 5 s,
every server in the same run; "server CPU" is per call):

    13:46  bare SDK server           1288 calls/s   656 us CPU   (7 rounds, load 19 -> 9)
           sandbox-mcp 2185d16       1217 calls/s   670 us CPU   ratio 0.95
           sandbox-mcp a3424b8       1056 calls/s   784 us CPU   ratio 0.82  (before)
    13:36  bare SDK server           1142 calls/s   724 us CPU   (7 rounds, load 16 -> 9)
           sandbox-mcp 2185d16       1237 calls/s   729 us CPU   ratio 1.08
           sandbox-mcp a3424b8        947 calls/s   958 us CPU   ratio 0.83  (before)
    13:26  bare SDK server           1384 calls/s   721 us CPU   (load 8 -> 3)
           sandbox-mcp 2185d16       1173 calls/s   847 us CPU   ratio 0.85
           sandbox-mcp a3424b8        951 calls/s  1066 us CPU   ratio 0.69  (before)

    2185d16: sandbox_status served in one exchange (app/mcp/light_calls.py: no response
    stream, no disconnect-watching task to cancel, ~60 fewer objects a call for the
    cyclic collector), request ids in order (the audit index grows at its end).
    Calls/s move with the machine's other load from round to round (the before's
    ratio was 0.69 in one run, 0.83 in the next); the CPU a call costs moves less.

    07:40  bare SDK server           1191 calls/s   723 us CPU
           sandbox-mcp 188aa58        888 calls/s   946 us CPU   ratio 0.75
           sandbox-mcp a705c0c        868 calls/s  1032 us CPU   ratio 0.73  (before)
    07:01  bare SDK server           1283 calls/s   720 us CPU
           sandbox-mcp a705c0c        868 calls/s   926 us CPU   ratio 0.68  (before)
           + young-GC threshold       942 calls/s   900 us CPU   ratio 0.73

bench_light_calls.py in the 07:40 run, before (a705c0c) then after (188aa58), one
after the other: bare 565 / ours 373 calls/s (0.66), then bare 489 / ours 409 (0.84);
its client shares the two cores, so its bare figure moves with the load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))

from bench_light_calls import cpu_seconds, start_bare
from e2e_server import RunningServer, free_port, start_server, stop_server
from mcp_http import read_jsonrpc, rpc_request
from oauth_browser import ManualClient

CONNECTIONS = 16
THREADS = 2
WARMUP_S = 2

_SCRIPT = """
wrk.method = "POST"
wrk.body = {body}
{headers}
"""


@dataclass
class Round:
    rps: float
    requests: int
    cpu_us: float
    p50_ms: float
    errors: int


@dataclass
class Target:
    label: str
    url: str
    script: Path
    pid: int


def lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string of ASCII is a valid Lua string literal


def write_script(path: Path, request: dict[str, object]) -> Path:
    headers = request["headers"]
    assert isinstance(headers, dict)
    lines = "\n".join(f"wrk.headers[{lua_string(k)}] = {lua_string(v)}" for k, v in headers.items())
    path.write_text(_SCRIPT.format(body=lua_string(str(request["content"])), headers=lines))
    return path


def run_wrk(target: Target, seconds: float) -> Round:
    cpu = cpu_seconds(target.pid)
    done = subprocess.run(
        [
            "wrk",
            f"-t{THREADS}",
            f"-c{CONNECTIONS}",
            f"-d{round(seconds)}s",
            "--latency",
            "-s",
            str(target.script),
            target.url,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    cpu = cpu_seconds(target.pid) - cpu
    out = done.stdout
    rps = float(_find(r"Requests/sec:\s+([\d.]+)", out))
    requests = int(_find(r"(\d+) requests in", out))
    p50 = _find(r"50%\s+([\d.]+)(us|ms|s)\b", out, whole=True)
    # Answers other than 200 and the socket errors (connect, read, write, timeout).
    errors = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    errors += sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    return Round(rps, requests, cpu / max(1, requests) * 1e6, p50, errors)


def _find(pattern: str, text: str, *, whole: bool = False) -> float:
    match = re.search(pattern, text)
    if match is None:
        raise RuntimeError(f"wrk printed no {pattern!r}:\n{text}")
    if not whole:
        return float(match.group(1))
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[match.group(2)]
    return float(match.group(1)) * scale


def line(label: str, rounds: list[Round]) -> str:
    rps = statistics.median(r.rps for r in rounds)
    shown = " ".join(f"{r.rps:5.0f}" for r in rounds)
    return (
        f"{label:38s} {rps:6.0f} calls/s (rounds {shown})  "
        f"p50 {statistics.median(r.p50_ms for r in rounds):5.2f} ms  "
        f"server CPU {statistics.median(r.cpu_us for r in rounds):4.0f} us/call  "
        f"errors {sum(r.errors for r in rounds)}"
    )


async def check_ok(http: httpx2.AsyncClient, url: str, request: dict[str, object]) -> None:
    """One call by hand first: a bench of error answers would measure nothing."""
    response = await http.post(url, **request)  # type: ignore[arg-type]
    answer = read_jsonrpc(response)
    if response.status_code != 200 or answer.get("result", {}).get("isError", True):
        raise RuntimeError(f"the call does not succeed: {response.status_code} {response.text}")


def audit_rows(state: Path) -> int:
    with sqlite3.connect(state / "sandbox-mcp.db") as db:
        (count,) = db.execute("SELECT COALESCE(SUM(calls), 0) FROM tool_calls").fetchone()
    db.close()
    return int(count)


async def main(rounds: int, seconds: int, also: list[Path]) -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian/Ubuntu: apt-get install -y wrk)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        port = free_port()
        bare = start_bare(port)
        settings = {
            "SANDBOX_MCP_AUTH": "oauth",
            "SANDBOX_MCP_POOL_SIZE": "4",
            "SANDBOX_MCP_LOG_LEVEL": "WARNING",
            "SANDBOX_MCP_AUDIT_ROWS_PER_SANDBOX_PER_DAY": "100000000",
            "SANDBOX_MCP_AUDIT_ROWS_PER_ADDRESS_PER_DAY": "100000000",
        }
        ours: list[tuple[str, Path, RunningServer]] = []
        targets: list[Target] = []
        try:
            for index, checkout in enumerate([None, *also]):
                state = root / f"state-{index}"
                # Another checkout's server: ``python -m app`` imports from its directory.
                wrapper = () if checkout is None else ("env", "-C", str(checkout.resolve()))
                label = "sandbox-mcp" if checkout is None else f"sandbox-mcp ({checkout.name})"
                ours.append((label, state, start_server(state, wrapper=wrapper, **settings)))
            async with httpx2.AsyncClient(timeout=60) as http:
                bare_url = f"http://127.0.0.1:{port}/mcp"
                for _ in range(300):
                    try:
                        await http.get(f"http://127.0.0.1:{port}/")
                        break
                    except httpx2.TransportError:
                        await asyncio.sleep(0.1)
                echo = rpc_request("tools/call", {"name": "echo", "arguments": {"text": "hi"}})
                echo["headers"]["mcp-name"] = "echo"
                await check_ok(http, bare_url, echo)
                targets.append(
                    Target(
                        "bare SDK server, echo (floor)",
                        bare_url,
                        write_script(root / "bare.lua", echo),
                        bare.pid,
                    )
                )
                for index, (label, _, server) in enumerate(ours):
                    client = await ManualClient.register(http, server.base_url)
                    token = await client.access_token(http)
                    status = rpc_request(
                        "tools/call",
                        {"name": "sandbox_status", "arguments": {}},
                        token=token,
                        name="sandbox_status",
                    )
                    await check_ok(http, server.mcp_url, status)
                    script = write_script(root / f"ours-{index}.lua", status)
                    targets.append(
                        Target(
                            f"{label}, sandbox_status + bearer",
                            server.mcp_url,
                            script,
                            server.process.pid,
                        )
                    )
            # Calls each of ours answered, to compare with its audit rows (the first by hand).
            answered = {t.label: 1 for t in targets[1:]}
            for target in targets:
                warm = run_wrk(target, WARMUP_S)
                if target.label in answered:
                    answered[target.label] += warm.requests
            figures: dict[str, list[Round]] = {t.label: [] for t in targets}
            for index in range(rounds):
                # Alternating, the order turned each round: a drift in the machine's load
                # falls on every server alike.
                shift = index % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    figures[target.label].append(run_wrk(target, seconds))
            for label in answered:
                answered[label] += sum(r.requests for r in figures[label])
            for target in targets:
                print(line(target.label, figures[target.label]))
            floor = statistics.median(r.rps for r in figures[targets[0].label])
            for target in targets[1:]:
                mine = statistics.median(r.rps for r in figures[target.label])
                print(f"ratio {target.label.split(',')[0] + ' / bare':32s} {mine / floor:6.2f}")
        finally:
            bare.terminate()
            bare.wait(10)
            for _, _, server in ours:
                stop_server(server)
        # wrk counts the answers it read in time; calls in flight as a round ended were
        # answered too (and have rows), so there are at least as many rows as this.
        for (label, state, _), target in zip(ours, targets[1:], strict=True):
            print(
                f"{label}: audit rows after a clean stop {audit_rows(state)}, "
                f"calls wrk read {answered[target.label]}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--also", type=Path, action="append", default=[])
    arguments = parser.parse_args()
    asyncio.run(main(arguments.rounds, arguments.seconds, arguments.also))
