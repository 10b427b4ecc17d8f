"""The server's own image (Dockerfile): built here, run as documented, an experiment through it.

No registry is reachable, and none is needed: the Dockerfile's default BASE is the
locally built ``sandbox-mcp/python:3`` (``deploy/build-base-image``), and the image is
built FROM that default. Its dependencies come from PyPI during the build
(``--network host``: the build steps use the host's network, as `pip` on the host
does); a thin layer over the default base adds the host's CA bundle, because PyPI
may be reached through a TLS-inspecting proxy that only the host trusts.

Then the README's ``docker run`` block runs as it is written (only the port, the
state folder, the container's name and the image's tag are the test's own): on
loopback, non-root, the state dir mounted from a host folder under another path,
SANDBOX_MCP_HOST_STATE_DIR, the Docker socket. An agent signs in through the
published port and runs a command in an experiment the containerized server
creates (the docker-out-of-docker paths and the file ownership), and Claude Code,
added as the README says, reports it connected.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx2
import pytest
from bytecode_probe import UNCOMPILED_MODULES
from claude_code import ClaudeCode
from e2e_server import RunningServer, free_port
from mcp_http import run_command, tool, write_file
from oauth_browser import new_user

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
README_RUN = "<!-- tests/e2e/test_server_image.py runs this block as it is -->"
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


def default_base() -> str:
    """The BASE the Dockerfile builds from when none is given."""
    [base] = re.findall(r"^ARG BASE=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    return base


def readme_block(marker: str) -> str:
    """The README's fenced block after ``marker`` (or the block that opens with it)."""
    text = (REPO / "README.md").read_text()
    match = re.search(re.escape(marker) + r"\n```\w*\n(.*?)\n```", text, re.S) or re.search(
        r"^```\w*\n(" + re.escape(marker) + r".*?)\n```", text, re.S | re.M
    )
    assert match, f"no code block after {marker!r} in the README"
    return match.group(1)


def listed(output: str, name: str, url: str) -> str:
    """The status `claude mcp list` printed for ``name``."""
    match = re.search(rf"^{re.escape(name)}: {re.escape(url)} \(HTTP\) - (.+)$", output, re.M)
    assert match, output
    return match.group(1).strip()


def once(pattern: str, replacement: str, text: str) -> str:
    changed, count = re.subn(pattern, replacement, text, flags=re.M)
    assert count == 1, f"{pattern!r} is in the README's docker run {count} times, not once"
    return changed


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    base_image = default_base()
    client = docker.from_env()
    try:
        client.images.get(base_image)
    except docker.errors.ImageNotFound:
        pytest.fail(
            f"the Dockerfile's default BASE {base_image} is not on this host, and no "
            "registry is reachable: `docker build -t sandbox-mcp .` fails here"
        )
    finally:
        client.close()
    base = tmp_path_factory.mktemp("ca-base")
    shutil.copy(CA_BUNDLE, base / "ca-certificates.crt")
    (base / "Dockerfile").write_text(
        f"FROM {base_image}\n"
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
    """The README's docker run, as written; the host's state folder is not /state."""
    if os.geteuid() != 0:
        pytest.fail("this test hands a folder to uid 10001: run it as root (CI does)")
    state = tmp_path / "host-state"
    port = free_port()
    name = f"sandbox-mcp-e2e-{port}"
    script = readme_block(README_RUN)
    script = once(
        r"^export SANDBOX_MCP_PORT=\d+ STATE=\S+$",
        f"export SANDBOX_MCP_PORT={port} STATE={state}",
        script,
    )
    script = once(r"--name sandbox-mcp ", f"--name {name} ", script)
    script = once(r" sandbox-mcp$", f" {image}", script)  # the image's tag, last
    container_id = sh("bash", "-c", script).strip().splitlines()[-1]
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


async def test_claude_code_connects_to_the_readme_docker_run(
    served: RunningServer, tmp_path: Path
) -> None:
    """The README's `claude mcp add` against its docker run: before sign-in Claude Code
    is told to authenticate (the server answered, not a 421 for a foreign Host), and
    with a token it is connected."""
    [line] = [
        line
        for line in readme_block("claude mcp add").splitlines()
        if line.startswith("claude mcp add")
    ]
    port = served.base_url.rpartition(":")[2]
    args = shlex.split(line.split("#")[0].replace("$SANDBOX_MCP_PORT", port))[1:]
    assert served.mcp_url in args, args
    async with httpx2.AsyncClient(timeout=120) as http:
        token = await new_user(http, served.base_url)
    claude = ClaudeCode.in_dir(tmp_path / "claude")
    for extra in ([], ["--header", f"Authorization: Bearer {token}"]):
        named = [*args[:-2], "signed-in" if extra else args[-2], args[-1], *extra]
        added = await asyncio.to_thread(claude.run, *named)
        assert added.returncode == 0, added.stderr + added.stdout
    shown = await asyncio.to_thread(claude.run, "mcp", "list")
    assert shown.returncode == 0, shown.stderr + shown.stdout
    assert listed(shown.stdout, "sandbox", served.mcp_url) == "! Needs authentication"
    assert listed(shown.stdout, "signed-in", served.mcp_url) == "✔ Connected"
