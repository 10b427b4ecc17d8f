"""Benchmark: server start to the first /health 200 with 500 dir slots, beside two floors
measured in the same run: ``python -c 'import app.root.main'`` and a bare Starlette app served
by uvicorn (start to its first 200).

    uv run python tests/bench/bench_startup.py [--samples 5] [--slots 500]

The state dir is provisioned once (and its database migrated by the first, unmeasured,
start); every sample is then a restart, as an operator's would be. Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench_servers import pct

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))
from e2e_server import free_port

BARE = """
import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
async def health(_):
    return JSONResponse({"status": "ok"})
app = Starlette(routes=[Route("/health", health)])
uvicorn.run(app, port=int(sys.argv[1]), log_level="warning")
"""


def _health_status(port: int) -> int | None:
    """GET /health over a bare socket: an HTTP client per poll (TLS context and all)
    would take the CPU the starting server needs on a small machine."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            status = conn.recv(64).split(b" ", 2)
    except OSError:
        return None
    return int(status[1]) if len(status) > 1 and status[1].isdigit() else None


def until_healthy(argv: list[str], port: int, env: dict[str, str]) -> float:
    started = time.perf_counter()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{argv} exited {process.returncode}")
            if _health_status(port) == 200:
                return time.perf_counter() - started
            time.sleep(0.01)
    finally:
        process.terminate()
        process.wait(30)


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - started


def line(name: str, values: list[float], floor: list[float] | None = None) -> str:
    p50, p95 = pct(values, 0.5) * 1000, pct(values, 0.95) * 1000
    text = f"  {name:<44} p50 {p50:7.0f} ms  p95 {p95:7.0f} ms"
    if floor is not None:
        text += f"  ratio p50 {p50 / (pct(floor, 0.5) * 1000):4.2f}"
        text += f"  p95 {p95 / (pct(floor, 0.95) * 1000):4.2f}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--slots", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as root:
        state = Path(root) / "state"
        env = {
            **os.environ,
            "SANDBOX_MCP_STATE_DIR": str(state),
            "SANDBOX_MCP_POOL_SIZE": str(args.slots),
            "SANDBOX_MCP_AUTH": "oauth",
            "SANDBOX_MCP_WARM_CONTAINERS": "0",
            "SANDBOX_MCP_LOG_LEVEL": "warning",
        }
        subprocess.run(
            [sys.executable, "-m", "app", "provision", "--slots", str(args.slots)],
            check=True, env=env, capture_output=True,
        )  # fmt: skip

        def ours() -> float:
            port = free_port()
            serve_env = {**env, "SANDBOX_MCP_PORT": str(port)}
            return until_healthy([sys.executable, "-m", "app", "serve"], port, serve_env)

        def bare() -> float:
            port = free_port()
            return until_healthy([sys.executable, "-c", BARE, str(port)], port, env)

        ours()  # migrates the new database: a first start, not a restart
        served, imported, bare_app = [], [], []
        for _ in range(args.samples):
            imported.append(timed([sys.executable, "-c", "import app.root.main"]))
            bare_app.append(bare())
            served.append(ours())
        print(f"server start to /health 200, {args.slots} dir slots, {args.samples} samples")
        print(line("floor: python -c 'import app.root.main'", imported))
        print(line("floor: bare Starlette app to /health 200", bare_app))
        print(line("ours (vs import app.root.main)", served, imported))
        print(line("ours (vs the bare Starlette app)", served, bare_app))
        # Provisioning (as root) gave the slots folder a nosuid,nodev mount of its own.
        subprocess.run(["umount", str(state / "slots")], check=False, capture_output=True)


if __name__ == "__main__":
    main()
