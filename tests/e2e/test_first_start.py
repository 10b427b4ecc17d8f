"""A machine without the default image: `check`, /health and `serve` say so, and what to do.

Seen: `check` and /health reported ok with no image built, and the first
create_experiment answered IMAGE_MISSING.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest
from e2e_server import free_port, start_server, stop_server

pytestmark = pytest.mark.e2e

ABSENT = "sandbox-mcp/never-built:1"
WITHOUT_THE_DEFAULT = {
    "SANDBOX_MCP_IMAGES": f"sandbox-mcp/python:3,{ABSENT}",
    "SANDBOX_MCP_DEFAULT_IMAGE": ABSENT,
    "SANDBOX_MCP_POOL_SIZE": "1",
}


def sandbox_mcp(*argv: str, state: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *argv],
        env={**os.environ, "SANDBOX_MCP_STATE_DIR": str(state), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_fails_naming_the_missing_default_image(tmp_path: Path) -> None:
    done = sandbox_mcp("check", state=tmp_path / "state", **WITHOUT_THE_DEFAULT)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is False
    runtime = report["runtime"]
    assert runtime["reachable"] is True
    assert runtime["images"] == {
        "ready": ["sandbox-mcp/python:3"],
        "missing": [ABSENT],
        "default": ABSENT,
        "default_ready": False,
    }
    assert runtime["reason"].startswith(f"the default image {ABSENT} is not built: ")


def test_check_fails_when_docker_does_not_answer(tmp_path: Path) -> None:
    done = sandbox_mcp(
        "check", state=tmp_path / "state", DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock"
    )
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert (report["ok"], report["runtime"]["reachable"]) == (False, False)
    socket = f"unix://{tmp_path}/no-docker.sock"
    assert report["runtime"]["reason"] == (
        f"Docker does not answer at {socket} (DOCKER_HOST): no socket is there. "
        "Start the Docker engine, or point DOCKER_HOST at its socket."
    )


async def test_serve_without_docker_says_so_in_one_plain_sentence(tmp_path: Path) -> None:
    """A wrong DOCKER_HOST: the server starts degraded and says, once and plainly on
    stderr as well as in the JSON event, which socket it tried and that DOCKER_HOST
    named it; error codes in the log are readable, and the warm pool's refusal, met on
    every slot of every pass, is written once (issue 27: a raw docker-py error, advice
    to install Docker, "code": "[redacted]", 20 warm.create_refused in 25 s)."""
    socket = f"unix://{tmp_path}/no-docker.sock"
    server = start_server(
        tmp_path / "state",
        DOCKER_HOST=socket,
        SANDBOX_MCP_WARM_CONTAINERS="2",
        **WITHOUT_THE_DEFAULT | {"SANDBOX_MCP_POOL_SIZE": "3"},
    )
    try:
        async with httpx2.AsyncClient(timeout=30) as http:
            body = (await http.get(f"{server.base_url}/health")).json()
        assert body["status"] == "degraded"
        sentence = f"Docker does not answer at {socket} (DOCKER_HOST): no socket is there."

        def refusals() -> list[dict[str, object]]:
            return [e for e in _events(server.log()) if e["event"] == "warm.create_refused"]

        deadline = time.monotonic() + 60
        while not refusals():
            assert time.monotonic() < deadline, server.log()[-2000:]
            await asyncio.sleep(0.2)
        # The first pass refused each of the two slots; two more passes (5 s apart).
        await asyncio.sleep(11)
        log = server.log()
    finally:
        stop_server(server)
    plain = [line for line in log.splitlines() if not line.startswith("{")]
    assert plain == [
        f"sandbox-mcp: {sentence} Start the Docker engine, or point DOCKER_HOST at its "
        "socket; until it answers the server runs degraded: sign-in and files work, "
        "experiments do not."
    ]
    events = _events(log)
    [unreachable] = [e for e in events if e["event"] == "runtime.unreachable"]
    assert unreachable["reason"] == sentence
    assert "install" not in log
    [skipped] = [e for e in events if e["event"] == "experiments.sweep_skipped"]
    assert skipped["code"] == "RUNTIME_UNAVAILABLE"
    [refused] = [e for e in events if e["event"] == "warm.create_refused"]
    assert "cannot be reached" in str(refused["reason"])


def _events(log: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


async def test_serve_starts_degraded_and_logs_what_to_run(tmp_path: Path) -> None:
    server = start_server(tmp_path / "state", **WITHOUT_THE_DEFAULT)
    try:
        async with httpx2.AsyncClient(timeout=30) as http:
            body = (await http.get(f"{server.base_url}/health")).json()
        assert body["status"] == "degraded"
        assert body["runtime"]["images"]["missing"] == [ABSENT]
        assert body["runtime"]["reason"] == f"the default image {ABSENT} is not built"
        [warning] = [
            json.loads(line)
            for line in server.log().splitlines()
            if "images.default_missing" in line
        ]
        assert warning["image"] == ABSENT
        assert "build or pull it under that tag" in warning["todo"]
    finally:
        stop_server(server)


def test_serve_build_images_stops_with_one_sentence_when_it_cannot_build(tmp_path: Path) -> None:
    done = sandbox_mcp(
        "serve",
        "--build-images",
        state=tmp_path / "state",
        SANDBOX_MCP_AUTH="none",
        SANDBOX_MCP_PORT=str(free_port()),
        **WITHOUT_THE_DEFAULT,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"sandbox-mcp: Cannot build the default image: {ABSENT} is not one of "
        "deploy/build-base-image's images: build or pull it under that tag, or choose "
        "another SANDBOX_MCP_DEFAULT_IMAGE."
    )
