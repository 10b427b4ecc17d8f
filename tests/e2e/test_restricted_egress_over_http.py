"""Network "restricted": package registries through the server's Squid, and nothing else.

The real server over HTTP, real Docker, real Squid; the outside world is a registry
in a network namespace of the test's own (``egress_testkit``), which the proxy is
told the registry names resolve to.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer, start_server, stop_server
from egress_testkit import (
    BIG_BYTES,
    BIG_FILE,
    FETCH,
    GIT_REPO,
    NODE_IMAGE,
    PYTHON_IMAGE,
    OutsideWorld,
    remove_restricted_network,
    usage_lines_of,
)
from mcp_http import run_command, run_to_the_end, tool

pytestmark = pytest.mark.e2e

BAD_NAMES = ("metadata.test", "private.test", "host.test", "loopback.test")
CEILING = "pypi.org,files.pythonhosted.org,registry.npmjs.org,github.com," + ",".join(BAD_NAMES)
CONNECT = (
    "python3 - <<'EOF'\n"
    "import socket\n"
    "s = socket.socket(); s.settimeout(2)\n"
    "try:\n"
    "    s.connect(({host!r}, {port})); print('connected')\n"
    "except OSError as exc:\n"
    "    print('blocked', exc)\n"
    "EOF"
)


def restricted_server(state: Path, world: OutsideWorld, **env: str) -> RunningServer:
    hosts = world.test_hosts(
        **{
            "metadata.test": "169.254.169.254",
            "private.test": "10.0.0.1",
            "host.test": world.host,
            "loopback.test": "127.0.0.1",
        }
    )
    return start_server(
        state,
        SANDBOX_MCP_EGRESS_PROXY="true",
        SANDBOX_MCP_EGRESS_ALLOWLIST=CEILING,
        SANDBOX_MCP_EGRESS_TEST_HOSTS=hosts,
        SANDBOX_MCP_IMAGES=f"{PYTHON_IMAGE},{NODE_IMAGE}",
        SANDBOX_MCP_DEFAULT_IMAGE=PYTHON_IMAGE,
        SANDBOX_MCP_POOL_SIZE="2",
        SANDBOX_MCP_MAX_EXPERIMENTS="10",
        **env,
    )


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, world: OutsideWorld
) -> Iterator[RunningServer]:
    running = restricted_server(tmp_path_factory.mktemp("restricted") / "state", world)
    yield running
    stop(running)


def stop(server: RunningServer) -> None:
    """Stop the server, then remove what it leaves for a restart (egress_testkit)."""
    network = re.search(r'"network": "([^"]+)".*"egress.started"', server.log())
    stop_server(server)
    if network is not None:
        remove_restricted_network(network[1])


@pytest.fixture(autouse=True)
async def destroy_afterwards(
    http: httpx2.AsyncClient, request: pytest.FixtureRequest
) -> AsyncIterator[None]:
    """A sandbox holds a few containers: each test's experiments go when it ends."""
    yield
    if "server" not in request.fixturenames:
        return
    server: RunningServer = request.getfixturevalue("server")
    listed = await tool(http, server, "", "list_experiments")
    for experiment in listed.get("experiments", []):
        if experiment["state"] != "DESTROYED":
            await tool(
                http,
                server,
                "",
                "destroy_experiment",
                {"experiment_id": experiment["experiment_id"]},
            )


async def create(http: httpx2.AsyncClient, server: RunningServer, **arguments: Any) -> str:
    created = await tool(
        http, server, "", "create_experiment", {"network": "restricted", **arguments}
    )
    assert not created["is_error"], created
    assert created["network_mode"] == "restricted"
    return str(created["experiment_id"])


async def test_pip_and_npm_install_from_the_registry_unconfigured(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    python = await create(http, server)
    # An install can outlast the synchronous wait on a busy machine: its end is read.
    pip = await run_to_the_end(
        http,
        server,
        "",
        python,
        # The image's own pip, as an agent types it: no flag, no configuration.
        "pip install tinypkg && python3 -c 'import tinypkg; print(\"value\", tinypkg.VALUE)'",
    )
    assert pip["exit_code"] == 0, (pip["stdout"], pip["stderr"])
    assert "value 42" in pip["stdout"]
    assert "[sandbox-mcp]" not in pip["stderr"]
    node = await create(http, server, image=NODE_IMAGE)
    npm = await run_to_the_end(
        http,
        server,
        "",
        node,
        "npm install --no-audit --no-fund tiny-npm-pkg && "
        "node -e \"console.log(require('tiny-npm-pkg'))\"",
    )
    assert npm["exit_code"] == 0, (npm["stdout"], npm["stderr"])
    assert "from the registry" in npm["stdout"]


async def test_a_name_off_the_list_is_refused_and_the_result_says_so(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    experiment = await create(http, server)
    urls = ["https://example.com/", "http://example.com/"]
    result = await run_command(http, server, "", experiment, FETCH.format(urls=urls))
    assert "reached" not in result["stdout"], result
    assert [line.split()[:2] for line in result["stdout"].splitlines()] == [
        ["failed", "https://example.com/"],
        ["failed", "http://example.com/"],
    ]
    notice = result["stderr"]
    assert "The egress proxy refused 2 connection(s)" in notice
    assert "example.com:443: not on this experiment's allow-list" in notice
    assert "example.com:80: not on this experiment's allow-list" in notice
    assert "SANDBOX_MCP_EGRESS_ALLOWLIST" in notice  # what to do
    again = await run_command(http, server, "", experiment, "true")
    assert "egress proxy refused" not in again["stderr"], "each refusal is told once"


async def test_listed_names_that_resolve_to_the_host_or_private_addresses_are_refused(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    experiment = await create(http, server)
    urls = [f"https://{name}/" for name in BAD_NAMES] + ["http://metadata.test/latest/meta-data/"]
    result = await run_command(http, server, "", experiment, FETCH.format(urls=urls))
    assert "reached" not in result["stdout"], result
    for name in BAD_NAMES:
        assert f"{name}:443: it resolves to an address that is not public" in result["stderr"]
    assert "metadata.test:80: it resolves to an address that is not public" in result["stderr"]


async def test_no_connection_bypasses_the_proxy(
    http: httpx2.AsyncClient, server: RunningServer, world: OutsideWorld
) -> None:
    listener = socket.create_server(("0.0.0.0", 0))
    port = listener.getsockname()[1]
    threading.Thread(target=accept_quietly, args=(listener,), daemon=True).start()
    try:
        experiment = await create(http, server)
        gateway = await proxy_address(http, server, experiment)
        direct = await run_command(
            http, server, "", experiment, CONNECT.format(host=world.registry, port=443)
        )
        assert "blocked" in direct["stdout"], direct
        host = await run_command(
            http, server, "", experiment, CONNECT.format(host=gateway, port=port)
        )
        assert "blocked" in host["stdout"], host
        proxy = await run_command(
            http, server, "", experiment, CONNECT.format(host=gateway, port=3128)
        )
        assert "connected" in proxy["stdout"], proxy  # the one way out is open
        lookup = await run_command(
            http,
            server,
            "",
            experiment,
            "timeout 3 python3 -c 'import socket; print(socket.gethostbyname(\"pypi.org\"))'",
        )
        assert lookup["exit_code"] != 0, lookup  # no DNS either: names are the proxy's
    finally:
        listener.close()


def accept_quietly(listener: socket.socket) -> None:
    with contextlib.suppress(OSError):  # closed when the test ends
        listener.accept()


async def proxy_address(http: httpx2.AsyncClient, server: RunningServer, experiment: str) -> str:
    shown = await run_command(http, server, "", experiment, "echo $HTTPS_PROXY $https_proxy")
    found = re.fullmatch(r"http://([0-9.]+):3128 http://\1:3128", shown["stdout"].strip())
    assert found, shown
    return found[1]


async def test_two_restricted_experiments_cannot_reach_each_other(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    first, second = await create(http, server), await create(http, server)
    serving = await run_command(
        http, server, "", second, "python3 -m http.server 8000 --bind 0.0.0.0", background=True
    )
    assert not serving["is_error"], serving
    address = await run_command(
        http,
        server,
        "",
        second,
        "sleep 1; python3 -c 'import socket; print(socket.gethostbyname(socket.gethostname()))'",
    )
    ip = address["stdout"].strip()
    own = await run_command(http, server, "", second, CONNECT.format(host=ip, port=8000))
    assert "connected" in own["stdout"], own  # it does listen
    other = await run_command(http, server, "", first, CONNECT.format(host=ip, port=8000))
    assert "blocked" in other["stdout"], other


async def test_an_experiment_asks_for_fewer_names_and_more_is_clamped(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    runtime = await tool(http, server, "", "check_sandbox_runtime")
    assert "restricted" in runtime["network_modes"]
    assert runtime["egress_allowlist"] == CEILING.split(",")
    created = await tool(
        http,
        server,
        "",
        "create_experiment",
        {"network_mode": "restricted", "egress_allowlist": ["pypi.org", "evil.example"]},
    )
    assert not created["is_error"], created
    assert any("evil.example" in warning for warning in created["warnings"]), created
    assert created["isolation"]["egress_allowlist"] == ["pypi.org"]
    urls = ["https://pypi.org/simple/tinypkg/", "https://registry.npmjs.org/tiny-npm-pkg"]
    result = await run_command(http, server, "", created["experiment_id"], FETCH.format(urls=urls))
    assert "reached https://pypi.org/simple/tinypkg/" in result["stdout"], result
    assert "registry.npmjs.org:443: not on this experiment's allow-list" in result["stderr"]
    misplaced = await tool(
        http, server, "", "create_experiment", {"egress_allowlist": ["pypi.org"]}
    )
    assert misplaced["is_error"], misplaced
    assert misplaced["error"]["code"] == "INVALID_ARGUMENT"
    assert "applies to network 'restricted' only" in misplaced["error"]["message"]


async def test_a_git_clone_goes_through_the_proxy(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    created = await tool(http, server, "", "create_experiment", {"git": {"url": GIT_REPO}})
    assert not created["is_error"], created
    readme = await run_command(http, server, "", created["experiment_id"], "cat README.md")
    assert "cloned through the egress proxy" in readme["stdout"]
    refused = await tool(
        http, server, "", "create_experiment", {"git": {"url": "https://example.com/o/r.git"}}
    )
    assert refused["is_error"], refused
    assert "not on this experiment's allow-list" in refused["error"]["message"], refused


async def test_refusals_and_bytes_are_counted_in_metrics(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    experiment = await create(http, server)
    urls = ["https://example.com/", "https://pypi.org/simple/tinypkg/"]
    await run_command(http, server, "", experiment, FETCH.format(urls=urls))
    deadline = time.monotonic() + 10
    while True:
        text = (await http.get(f"{server.base_url}/metrics")).text
        refused = _sample(text, 'sandbox_mcp_egress_refused_total{reason="not_allowed"}')
        moved = _sample(text, "sandbox_mcp_egress_bytes_total")
        if (refused and moved) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert refused >= 1
    assert moved > 0
    await tool(http, server, "", "destroy_experiment", {"experiment_id": experiment})
    recorded = await usage_lines_of(server, experiment)
    assert recorded, server.log()[-3000:]  # the experiment's egress, recorded when it goes
    assert re.search(r'"bytes": [1-9]', recorded[0])
    assert '"refused": 1' in recorded[0]


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


CAP = 2 * 1024 * 1024
SLOW_BYTES = 16 * 1024 * 1024  # 6.4 s at the registry's 2.5 MiB/s, if nothing cuts it
DOWNLOAD = (
    "python3 - <<'EOF'\n"
    "import urllib.request\n"
    "got = 0\n"
    "try:\n"
    "    with urllib.request.urlopen({url!r}, timeout=30) as reply:\n"
    "        length = int(reply.headers['Content-Length'])\n"
    "        while chunk := reply.read(65536):\n"
    "            got += len(chunk)\n"
    "    print('complete' if got == length else 'cut', got)\n"
    "except Exception as exc:\n"  # a reset, or TLS's own end cut short
    "    print('cut', got, type(exc).__name__)\n"
    "EOF"
)


async def test_byte_cap_and_the_proxy_lives_and_dies_with_the_server(
    http: httpx2.AsyncClient, tmp_path: Path, world: OutsideWorld
) -> None:
    running = restricted_server(tmp_path / "state", world, SANDBOX_MCP_EGRESS_MAX_BYTES=str(CAP))
    big = [f"https://files.pythonhosted.org/packages/{BIG_FILE}"]  # 1.5 MiB: under the cap
    try:
        experiment, survivor = await create(http, running), await create(http, running)
        first = await run_command(http, running, "", experiment, FETCH.format(urls=big))
        assert f"reached {big[0]}" in first["stdout"], first
        assert "EGRESS_CAP_REACHED" not in first["stderr"], first
        health = (await http.get(f"{running.base_url}/health")).json()
        assert health["status"] == "ok", health
        assert health["egress_proxy"]["ok"] is True
        pid = int(re.search(r'"pid": (\d+).*"egress.started"', running.log())[1])  # type: ignore[index]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (health := (await http.get(f"{running.base_url}/health")).json())["status"] == "ok":
            assert time.monotonic() < deadline, health
            await asyncio.sleep(0.1)
        assert health["status"] == "degraded"
        assert "egress proxy (squid) exited" in health["egress_proxy"]["reason"]
    finally:
        stop_server(running)
    second = restricted_server(tmp_path / "state", world, SANDBOX_MCP_EGRESS_MAX_BYTES=str(CAP))
    try:
        # A container that outlived the restart keeps its list (its label) and its way out.
        page = ["https://pypi.org/simple/tinypkg/"]
        again = await run_command(http, second, "", survivor, FETCH.format(urls=page))
        assert f"reached {page[0]}" in again["stdout"], again
        # The restart kept what the experiment moved: 1.5 MiB more passes the cap (the
        # transfer may be cut on the way, or end first: the result says so either way).
        over = await run_command(http, second, "", experiment, FETCH.format(urls=big))
        assert (
            f"EGRESS_CAP_REACHED: the egress byte cap ({CAP:,} bytes) is used up"
            in (over["stderr"])
        ), over
        refused = await run_command(http, second, "", experiment, FETCH.format(urls=big))
        assert f"failed {big[0]}" in refused["stdout"], refused
        assert (
            "files.pythonhosted.org:443: this experiment has used its egress byte cap"
            in (refused["stderr"])
        )
        assert "EGRESS_CAP_REACHED" not in refused["stderr"], "the cap is told once"
        pid = int(re.search(r'"pid": (\d+).*"egress.started"', second.log())[1])  # type: ignore[index]
    finally:
        stop(second)
    assert not os.path.exists(f"/proc/{pid}"), "squid is stopped with the server"  # noqa: ASYNC240


KEPT_ALIVE = (
    "python3 - <<'EOF'\n"
    "import http.client, os, time, urllib.parse\n"
    "proxy = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])\n"
    "conn = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=10)\n"
    "for url, pause in (({big!r}, 2.5), ('http://pypi.org/simple/tinypkg/', 0)):\n"
    "    conn.request('GET', url)\n"
    "    print(len(conn.getresponse().read()), flush=True)\n"
    "    time.sleep(pause)\n"
    "EOF"
)


async def test_the_byte_cap_cuts_a_download_in_progress(
    http: httpx2.AsyncClient, tmp_path: Path, world: OutsideWorld
) -> None:
    running = restricted_server(tmp_path / "state", world, SANDBOX_MCP_EGRESS_MAX_BYTES=str(CAP))
    try:
        # Plain http kept alive: Squid logs the 1.5 MiB while the connection stays
        # open (two polls pass); counted once, they leave room for the next request.
        kept = await create(http, running)
        big = f"http://files.pythonhosted.org/packages/{BIG_FILE}"
        alive = await run_command(http, running, "", kept, KEPT_ALIVE.format(big=big))
        assert alive["stdout"].split()[0] == str(BIG_BYTES), alive
        assert len(alive["stdout"].split()) == 2, (alive["stdout"], alive["stderr"])
        assert "EGRESS_CAP_REACHED" not in alive["stderr"], alive["stderr"]
        experiment = await create(http, running)
        url = f"https://files.pythonhosted.org/slow/{SLOW_BYTES}"
        result = await run_command(http, running, "", experiment, DOWNLOAD.format(url=url))
        words = result["stdout"].split()
        # Without the live count Squid would log the transfer once it ended, whole.
        assert words[0] == "cut", (result["stdout"], result["stderr"])
        # What passes the cap: about one poll (1 s) of the transfer, 2.5 MiB here; the
        # bound checked leaves the loaded machine room for a late poll.
        assert CAP - 64 * 1024 <= int(words[1]) < CAP + 8 * 1024 * 1024, result
        assert (
            f"EGRESS_CAP_REACHED: the egress byte cap ({CAP:,} bytes) is used up"
            in (result["stderr"])
        ), result
        assert "cut this experiment's open connections" in result["stderr"]
    finally:
        stop(running)
