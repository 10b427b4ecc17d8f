"""Measure: the modules and hops one ``execute_experiment`` crosses (issue 24's measure).

    uv run python tests/bench/trace_one_command.py

A real local-mode server (dir slots, real Docker) runs under a profiler
(``_trace_site/sitecustomize.py``). One experiment is created untraced; then the
profiler is armed and one ``execute_experiment("echo hi")`` is sent: from the moment
that request enters ``app/mcp/transport.py`` the profiler follows it through every task
and thread that inherits its context, recording only our own modules (app, auth, pool,
jail). Printed: the modules it entered (by package), the deepest chain of modules on
one stack (its hops: modules less one), and the caller-to-callee edges between
modules that cross a package. Not a pass/fail test: figures for the note.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from e2e_server import start_server, stop_server
from mcp_http import tool

ROOT = Path(__file__).resolve().parents[2]


def package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "app" and len(parts) > 2 else parts[0]


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="trace-one-command-") as root:
        out = Path(root) / "trace.json"
        site = str(Path(__file__).with_name("_trace_site"))
        os.environ["SMCP_TRACE_ROOT"] = str(ROOT)
        os.environ["SMCP_TRACE_OUT"] = str(out)
        pythonpath = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = site + (os.pathsep + pythonpath if pythonpath else "")
        try:
            server = start_server(Path(root) / "state", SANDBOX_MCP_POOL_SIZE="2")
        finally:
            os.environ.pop("PYTHONPATH") if pythonpath is None else None
        try:
            async with httpx2.AsyncClient(timeout=300) as http:
                created = await tool(http, server, "", "create_experiment", {})
                assert not created["is_error"], created
                arguments = {"experiment_id": created["experiment_id"], "command": "echo hi"}
                warm = await tool(http, server, "", "execute_experiment", arguments)
                assert warm.get("stdout") == "hi\n", warm  # the executor is up: a steady call
                server.process.send_signal(signal.SIGUSR1)
                await asyncio.sleep(0.5)
                ran = await tool(http, server, "", "execute_experiment", arguments)
                assert ran.get("stdout") == "hi\n", ran
            server.process.send_signal(signal.SIGUSR2)
            await asyncio.to_thread(wait_for, out)
        finally:
            stop_server(server)
        report = json.loads(out.read_text())
    modules: dict[str, int] = report["modules"]
    deepest: list[str] = report["deepest"]
    crossing = [(a, b) for a, b in report["edges"] if package(a) != package(b)]
    print("one execute_experiment('echo hi'), steady state (the executor already up):")
    print(f"  modules of ours entered: {len(modules)}")
    for name, count in sorted(Counter(package(m) for m in modules).items()):
        inside = sorted(m.removeprefix(name + ".") for m in modules if package(m) == name)
        print(f"    {name:<18} {count:>3}  {' '.join(inside)}")
    print(f"  deepest chain: {len(deepest)} modules, {len(deepest) - 1} hops")
    for module in deepest:
        print(f"    {module}")
    print(f"  module-to-module edges: {len(report['edges'])}, crossing a package: {len(crossing)}")
    for a, b in crossing:
        print(f"    {a} -> {b}")


if __name__ == "__main__":
    asyncio.run(main())
