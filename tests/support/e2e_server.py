"""End-to-end support: a real server process (`python -m app serve`) on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from docker_testkit import remove_containers_mounting


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningServer:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    # Where its deployment's state lives: another process of the same deployment is
    # started on it (``Servers(state_dir=...)``).
    state_dir: Path | None = None

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"

    def log(self) -> str:
        """What the server wrote to stderr."""
        return self.log_path.read_text(errors="replace")

    def stdout(self) -> str:
        return self.log_path.with_suffix(".stdout").read_text(errors="replace")


START_TIMEOUT_S = 180.0
PROBE_APP = Path(__file__).with_name("probe_app.py")
# The production shares of every global budget, for the tests of the shares.
DEFAULT_SHARES = {
    "SANDBOX_MCP_NETWORK_SHARE_PERCENT": "10",
    "SANDBOX_MCP_ADDRESS_SHARE_PERCENT": "5",
}


# Every state dir a server was started on in this process, until the end of the test
# whose folder holds it removes the containers below it (``started_below``).
_STARTED: set[Path] = set()


def started_below(folder: Path) -> list[Path]:
    """The state dirs below ``folder`` that servers were started on, forgotten here: the
    end of the test that owns ``folder`` removes the containers mounting them."""
    found = [state for state in _STARTED if state.is_relative_to(folder)]
    _STARTED.difference_update(found)
    return found


def start_server(
    state_dir: Path,
    *,
    probe: bool = False,
    port: int | None = None,
    host: str = "127.0.0.1",
    nofile: tuple[int, int] | None = None,
    wrapper: Sequence[str] = (),
    **env: str,
) -> RunningServer:
    """Start ``python -m app serve`` (or, with ``probe``, the server plus a slot-taking
    probe tool) on ``host`` (a loopback address) and wait until /health answers.
    ``nofile`` is the (soft, hard) descriptor limit the process starts with, as a
    systemd unit would set it. ``wrapper``: a command that ends by exec'ing the rest of
    its arguments (the server keeps its process), to start it in another setting (an
    ``unshare``, or an ``nsenter`` into another mount namespace)."""
    _STARTED.add(state_dir)
    port = port or free_port()
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    log_path = state_dir.parent / f"server-{port}-{time.monotonic_ns()}.log"
    environment = {
        **os.environ,
        "SANDBOX_MCP_STATE_DIR": str(state_dir),
        "SANDBOX_MCP_PORT": str(port),
        "SANDBOX_MCP_HOST": host,
        "SANDBOX_MCP_AUTH": "none",
        # Warm containers only where a test asks for them (they are tests of their own).
        "SANDBOX_MCP_WARM_CONTAINERS": os.environ.get("SANDBOX_MCP_WARM_CONTAINERS", "0"),
        # ...and no growth with demand either: every test signs in, so each server would
        # otherwise start a container per sign-in (test_warm_burst sets its own budget).
        "SANDBOX_MCP_WARM_MAX_CONTAINERS": os.environ.get("SANDBOX_MCP_WARM_MAX_CONTAINERS", "0"),
        # Every test client connects from 127.0.0.1, one address: the shares of the
        # global budgets would make the whole suite one user (tests of their own set
        # them: DEFAULT_SHARES).
        "SANDBOX_MCP_NETWORK_SHARE_PERCENT": "100",
        "SANDBOX_MCP_ADDRESS_SHARE_PERCENT": "100",
        **env,
    }
    with log_path.open("wb") as log, log_path.with_suffix(".stdout").open("wb") as out:
        process = subprocess.Popen(
            [
                *wrapper,
                *(
                    [sys.executable, str(PROBE_APP)]
                    if probe
                    else [sys.executable, "-m", "app", "serve"]
                ),
            ],
            env=environment,
            stdout=out,
            stderr=log,
            preexec_fn=None if nofile is None else lambda: _limit_nofile(nofile),
        )
    server = RunningServer(f"http://{authority}", process, log_path, state_dir)
    # Generous: it guards against a server that never comes up, not a promise of speed
    # (a start takes ~2 s here, and over 30 s on a 2-core machine at load 30).
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited {process.returncode}:\n{server.log()}")
        try:
            if httpx2.get(f"{server.base_url}/health", timeout=1).status_code in (200, 503):
                return server
        except httpx2.TransportError:
            time.sleep(0.1)
    process.kill()
    process.wait()  # reaped here, not left to warn in whichever test runs next
    raise AssertionError(
        f"server did not answer /health in {START_TIMEOUT_S:.0f} s:\n{server.log()}"
    )


def _limit_nofile(limits: tuple[int, int]) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def stop_server(server: RunningServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


class Servers:
    """The e2e tests' one way to start servers: each call starts one (``start_server``'s
    options) in a state dir of its own below ``root``, and ``stop_all`` stops every one
    still running, the last started first. The fixtures ``serve`` (one test) and
    ``serve_module`` (one module) hand a test this factory and ``close`` it when done."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._running: list[RunningServer] = []
        self._state_dirs: list[Path] = []

    def __call__(self, *, state_dir: Path | None = None, **options: Any) -> RunningServer:
        """A started server; ``state_dir`` shared with another one makes several
        processes of one deployment (the first gets ``root/state``)."""
        if state_dir is None:
            taken = len(self._running)
            state_dir = self._root / ("state" if taken == 0 else f"state-{taken + 1}")
        if state_dir not in self._state_dirs:
            self._state_dirs.append(state_dir)
        server = start_server(state_dir, **options)
        self._running.append(server)
        return server

    def stop(self, server: RunningServer) -> None:
        """Stop one now (the rest at the end)."""
        self._running.remove(server)
        stop_server(server)

    def stop_all(self) -> None:
        while self._running:
            stop_server(self._running.pop())

    def close(self) -> None:
        """Stop every server still running, then remove every container that mounts
        anything below the state dirs they ran on. Not ``stop``'s job: a server keeps
        its experiments' containers when it stops, for the next start on its state dir
        to adopt (tests stop and start one on purpose); once the test is done nothing
        adopts them, and a CI run piled up a hundred running ones (each an executor, a
        shim and its memory) on a 2-core machine."""
        self.stop_all()
        if self._state_dirs:
            remove_containers_mounting(*self._state_dirs)
