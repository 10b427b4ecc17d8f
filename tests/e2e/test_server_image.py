"""The server's own image (Dockerfile): built here, run as documented, an experiment through it.

No registry is reachable, so the image is built FROM the locally built
``sandbox-mcp/python:3`` (``deploy/build-base-image``; the Dockerfile takes any
Debian 12 image with python3 as BASE). Its dependencies come from PyPI during the
build (``--network host``: the build steps use the host's network, as `pip` on
the host does); a thin layer adds the host's CA bundle, because PyPI may be
reached through a TLS-inspecting proxy that only the host trusts.

Then the image runs as the README says (non-root, the state dir mounted from a
host folder under another path, SANDBOX_MCP_HOST_STATE_DIR, the Docker socket),
and an agent signs in and runs a command in an experiment the containerized
server creates: the docker-out-of-docker paths and the file ownership are what
this proves.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx2
import pytest
from bytecode_probe import UNCOMPILED_MODULES
from e2e_server import RunningServer, free_port
from mcp_http import run_command, tool, write_file
from oauth_browser import new_user

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "sandbox-mcp/python:3"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TAG = "sandbox-mcp:e2e-image"


def as_sandbox_uid(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", "--reuid=10002", "--regid=10002", "--clear-groups", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def sh(*args: str, timeout: float = 900) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    client = docker.from_env()
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{BASE_IMAGE} is missing: run deploy/build-base-image (.ci/run does)")
    finally:
        client.close()
    base = tmp_path_factory.mktemp("ca-base")
    shutil.copy(CA_BUNDLE, base / "ca-certificates.crt")
    (base / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\n"
        "COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n"
        "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt "
        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt UV_NATIVE_TLS=1\n"
    )
    sh("docker", "build", "-q", "-t", "sandbox-mcp/python-ca:e2e", str(base))
    started = time.monotonic()
    sh(
        "docker", "build", "-q", "--network", "host",
        "--build-arg", "BASE=sandbox-mcp/python-ca:e2e", "-t", TAG, str(REPO),
    )  # fmt: skip
    print(f"server image built in {time.monotonic() - started:.1f} s")
    return TAG


@pytest.fixture
def served(image: str, tmp_path: Path) -> Iterator[RunningServer]:
    """The image, run as the README says; the host's state folder is not /state."""
    if os.geteuid() != 0:
        pytest.fail("this test hands a folder to uid 10001: run it as root (CI does)")
    state = tmp_path / "host-state"
    state.mkdir()
    os.chown(state, 10001, 10001)
    state.chmod(0o700)
    port = free_port()
    socket_gid = os.stat("/var/run/docker.sock").st_gid
    container_id = sh(
        "docker", "run", "-d", "--network", "host",
        "-e", "SANDBOX_MCP_HOST=127.0.0.1", "-e", f"SANDBOX_MCP_PORT={port}",
        "-e", f"SANDBOX_MCP_PUBLIC_URL=http://127.0.0.1:{port}",
        "-e", "SANDBOX_MCP_POOL_SIZE=2",
        "-v", f"{state}:/state", "-e", f"SANDBOX_MCP_HOST_STATE_DIR={state}",
        "-v", "/var/run/docker.sock:/var/run/docker.sock", "--group-add", str(socket_gid),
        image,
    ).strip()  # fmt: skip
    server = RunningServer(f"http://127.0.0.1:{port}", None, state / "unused.log")  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx2.get(f"{server.base_url}/health", timeout=1).status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError(sh("docker", "logs", container_id))
        yield server
    finally:
        logs = subprocess.run(["docker", "logs", container_id], capture_output=True, text=True)
        subprocess.run(["docker", "rm", "-f", container_id], capture_output=True, check=False)
        client = docker.from_env()
        managed = client.containers.list(
            all=True, filters={"label": "io.sandbox-mcp.managed"}, ignore_removed=True
        )
        for leftover in managed:
            sources = [str(m.get("Source", "")) for m in leftover.attrs["Mounts"]]
            if any(source.startswith(str(state)) for source in sources):
                with contextlib.suppress(docker.errors.NotFound):
                    leftover.remove(force=True)
        client.close()
        print(logs.stderr[-2000:])


def test_the_image_is_non_root_with_a_health_check_and_no_socket_inside(image: str) -> None:
    client = docker.from_env()
    try:
        config = client.images.get(image).attrs["Config"]
    finally:
        client.close()
    assert config["User"] == "sandbox-mcp"
    assert "/health" in " ".join(config["Healthcheck"]["Test"])
    assert config["Entrypoint"] == ["sandbox-mcp"]
    assert "SANDBOX_MCP_SANDBOX_USER=10002:10002" in config["Env"]
    listing = sh(
        "docker", "run", "--rm", "--network", "none", "--entrypoint", "ls", image, "-a", "/var/run"
    )
    assert "docker.sock" not in listing


def test_the_image_runs_its_python_precompiled(image: str) -> None:
    """It runs with PYTHONDONTWRITEBYTECODE: a module without its .pyc in the image is
    compiled again at every start (1.2 s of CPU of the 2 s to /health, issue 13)."""
    found = sh(
        "docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", image,
        "-c", UNCOMPILED_MODULES,
    )  # fmt: skip
    assert found.strip().splitlines()[-1] == "[]"


async def test_an_agent_runs_a_command_through_the_containerized_server(
    served: RunningServer,
) -> None:
    async with httpx2.AsyncClient(timeout=120) as http:
        token = await new_user(http, served.base_url)
        made = await tool(http, served, token, "create_experiment", {"files": {"a.txt": "hello"}})
        assert not made["is_error"], made
        exp = made["experiment_id"]
        # The sandbox runs as 10002 and keeps a file private the way a tenant would.
        command = (
            "cat a.txt; echo new > b.txt; mkdir -m 700 private; echo secret > private/f; "
            "chmod 600 private/f; id -u >&2"
        )
        ran = await run_command(http, served, token, exp, command)
        assert ran["exit_code"] == 0, ran
        assert ran["stdout"] == "hello"
        assert ran["stderr"].strip() == "10002", "sandboxes run under a uid of their own"
        # The server (10001, with cap_chown/dac_override/fowner) still serves those files...
        for path, content in (("b.txt", "new\n"), ("private/f", "secret\n")):
            read = await tool(
                http, served, token, "read_sandbox_file", {"experiment_id": exp, "path": path}
            )
            assert read.get("content") == content, read
        wrote = await write_file(http, served, token, exp, "private/g", "from the server\n")
        assert not wrote["is_error"], wrote
        # ... and what it writes stays the sandbox's to change.
        edited = await run_command(
            http, served, token, exp, "echo more >> private/g; cat private/g"
        )
        assert edited["stdout"] == "from the server\nmore\n", edited
        destroyed = await tool(http, served, token, "destroy_experiment", {"experiment_id": exp})
        assert not destroyed["is_error"], destroyed

    # The sandbox's uid owns nothing of the server's: on the host (a process that got
    # out of its container), it can read neither the state dir nor the token key.
    state = served.log_path.parent
    for target in (["ls", str(state)], ["cat", str(state / "token-hmac.key")]):
        done = await asyncio.to_thread(as_sandbox_uid, *target)
        assert done.returncode != 0, done
        assert "Permission denied" in done.stderr, done
    assert (state / "token-hmac.key").exists()
    assert list((state / "slots").glob("slot-*/exp-*")) == [], "the 10002-owned tree was deleted"
