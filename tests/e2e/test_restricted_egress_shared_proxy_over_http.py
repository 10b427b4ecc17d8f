"""The one Squid every restricted tenant shares answers only for the sites, runs with
the descriptors the server asked, and no few tenants take its connections.

The real server over HTTP, real Docker, real Squid, the real firewall (iptables and
nftables); the outside world is ``egress_testkit``'s registry. The server starts with
a soft limit of 1,024 descriptors and a hard one of 4,096 (as a service manager would
give it) and asks Squid for 2,048 (which Squid alone would not get: it takes the hard
limit it inherits whatever its configuration says);
users sign in through the server's trusted proxy (loopback), which names their
address in ``X-Forwarded-For``, so one test holds several sandboxes of one address.
The crowd of addresses has a server of its own (16 slots, Squid asked for 1,024
descriptors: the fewest), so that its sandboxes fill every slot and, unbounded,
would fill Squid.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer
from egress_testkit import (
    BIG_BYTES,
    BIG_FILE,
    FETCH,
    OutsideWorld,
    hold,
    restricted_server,
)
from mcp_http import read_when_written, run_command, tool
from oauth_browser import new_users

from app.egress.bounds import size_bounds
from app.egress.connlimit import MAX_CONNECTIONS
from app.egress.squid import open_files_limit

pytestmark = pytest.mark.e2e

DESCRIPTORS = 2048  # asked for Squid: above the server's soft limit, under its hard one
SERVER_NOFILE = (1024, 4096)
SLOTS = 16  # a sandbox's share: (2048 - 256) // 2 // 16 = 56 connections
ADDRESS_SHARES = 2  # an address: two sandboxes' shares
HOSTILE, HONEST = "198.51.100.7", "203.0.113.9"

# The crowd's server: the least descriptors Squid may be asked for, (1024 - 256) // 2 =
# 384 connections, one sixteenth (24) a sandbox. Its hostile sandboxes, by sign-in
# address: two each from six IPv4 addresses in three networks, and three from one IPv6
# /64 (three addresses, one sign-in address: its third is over the address's share).
# Unbounded (64 a container), the 15 would hold 960 of Squid's 1,024 descriptors, past
# the 100 it keeps back before it stops accepting: the honest one would wait unanswered.
CROWD_DESCRIPTORS = 1024
CROWD_SLOTS = 16  # the 15 hostile sandboxes and the honest one
CROWD = {
    **{f"198.51.100.{n}": 2 for n in (21, 22)},
    **{f"203.0.113.{n}": 2 for n in (31, 32)},
    **{f"192.0.2.{n}": 2 for n in (41, 42)},
}
SIXTY_FOUR = ("2001:db8:64:64::a", "2001:db8:64:64::b", "2001:db8:64:64::c")
CROWD_HONEST = "2001:db8:77:77::9"  # yet another address, in a network of its own

# One raw request to the proxy; prints the answer's status line, Squid's error
# header if any, and whether the body holds what only the cache manager says.
ASK = """python3 - <<'EOF'
import os, socket
from urllib.parse import urlsplit
proxy = urlsplit(os.environ["http_proxy"])
s = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
s.sendall({request!r}.replace("GATEWAY", proxy.hostname).encode())
data = b""
while True:
    try:
        chunk = s.recv(65536)
    except OSError:
        break
    if not chunk:
        break
    data += chunk
head, _, body = data.partition(b"\\r\\n\\r\\n")
lines = head.decode(errors="replace").split("\\r\\n")
print("status", lines[0])
print("squid-error", next((l for l in lines if l.lower().startswith("x-squid-error")), "none"))
print("manager-says", b"FD desc" in body or b"Squid Object Cache" in body)
EOF"""
# (OPTIONS with Max-Forwards: 0 is answered before the access rules, with Squid's
# fixed 501 "unsupported request" page and nothing of anyone: not listed.) Before
# the manager rule, cache_object_info (its port), internal_mgr_of_the_proxy,
# connect_to_the_proxy and internal_static_absolute_url (rewritten to Squid's own
# name) were refused by the port and name rules already; they stay as guards.
FORMS = {
    "cache_object_url": "GET cache_object://pypi.org:80/active_requests HTTP/1.1\r\n"
    "Host: pypi.org\r\nConnection: close\r\n\r\n",
    "cache_object_info": "GET cache_object://pypi.org/info HTTP/1.1\r\n"
    "Host: pypi.org\r\nConnection: close\r\n\r\n",
    "internal_mgr_absolute_url": "GET http://pypi.org/squid-internal-mgr/active_requests "
    "HTTP/1.1\r\nHost: pypi.org\r\nConnection: close\r\n\r\n",
    "internal_static_absolute_url": "GET http://pypi.org/squid-internal-static/icons/SN.png "
    "HTTP/1.1\r\nHost: pypi.org\r\nConnection: close\r\n\r\n",
    "internal_mgr_of_the_proxy": "GET http://GATEWAY:3128/squid-internal-mgr/info HTTP/1.1\r\n"
    "Host: GATEWAY:3128\r\nConnection: close\r\n\r\n",
    "connect_to_the_proxy": "CONNECT GATEWAY:3128 HTTP/1.1\r\nHost: GATEWAY:3128\r\n\r\n",
    "trace": "TRACE http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\nMax-Forwards: 0\r\n"
    "Connection: close\r\n\r\n",
    "options_forwarded": "OPTIONS http://pypi.org/simple/ HTTP/1.1\r\nHost: pypi.org\r\n"
    "Connection: close\r\n\r\n",
}

HOLD = hold(200, 150, begin_request=True)  # the holding job ends by itself
INDEX = "https://pypi.org/simple/tinypkg/"
BIG = f"https://files.pythonhosted.org/packages/{BIG_FILE}"
DAY_BYTES = 2 * 1024**2  # a sandbox's daily budget here: one big download, not two


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, world: OutsideWorld
) -> Iterator[RunningServer]:
    with restricted_server(
        tmp_path_factory.mktemp("shared-proxy") / "state",
        world,
        nofile=SERVER_NOFILE,
        SANDBOX_MCP_EGRESS_ALLOWLIST="pypi.org,files.pythonhosted.org",
        SANDBOX_MCP_EGRESS_SANDBOX_BYTES_PER_DAY=str(DAY_BYTES),
        SANDBOX_MCP_MAX_EXPERIMENTS="4",
        SANDBOX_MCP_POOL_SIZE=str(SLOTS),
        SANDBOX_MCP_QUEUE_WAIT_S="0",
        SANDBOX_MCP_TRUSTED_PROXIES="127.0.0.1",
        SANDBOX_MCP_EGRESS_PROXY_DESCRIPTORS=str(DESCRIPTORS),
        SANDBOX_MCP_EGRESS_ADDRESS_SHARES=str(ADDRESS_SHARES),
    ) as running:
        yield running


def started(server: RunningServer) -> dict[str, Any]:
    """The server's ``egress.started`` line (what it asked of Squid and bounds with)."""
    for line in server.log().splitlines():
        if '"egress.started"' in line:
            return dict(json.loads(line[line.index("{") :]))
    raise AssertionError(server.log()[-3000:])


async def users_from(server: RunningServer, address: str, count: int) -> list[str]:
    """``count`` sandboxes signed in from ``address`` (as the trusted proxy says)."""
    headers = {"x-forwarded-for": address}
    async with httpx2.AsyncClient(timeout=120, headers=headers) as http:
        return await new_users(http, server.base_url, count)


async def restricted(
    http: httpx2.AsyncClient, server: RunningServer, token: str, *names: str
) -> str:
    allow = list(names or ("pypi.org",))
    made = await tool(
        http,
        server,
        token,
        "create_experiment",
        {"network": "restricted", "egress_allowlist": allow},
    )
    assert not made["is_error"], made
    return str(made["experiment_id"])


@pytest.fixture(scope="module")
def asker(server: RunningServer) -> tuple[str, str]:
    """A restricted experiment that sends raw requests to the proxy (one a module)."""

    async def make() -> tuple[str, str]:
        (token,) = await users_from(server, "192.0.2.10", 1)
        async with httpx2.AsyncClient(timeout=120) as http:
            return token, await restricted(http, server, token)

    return asyncio.run(make())


@pytest.mark.parametrize("form", sorted(FORMS))
async def test_squid_answers_none_of_its_own_pages_nor_trace_or_options(
    http: httpx2.AsyncClient, server: RunningServer, asker: tuple[str, str], form: str
) -> None:
    token, experiment = asker
    done = await run_command(
        http, server, token, experiment, ASK.format(request=FORMS[form]), timeout_s=60
    )
    answer = dict(line.split(" ", 1) for line in done["stdout"].splitlines() if " " in line)
    print(f"\n{form}: {answer}")
    assert answer.get("manager-says") == "False", done
    assert answer.get("status", "").startswith("HTTP/1.1 403"), done
    assert answer.get("squid-error", "").startswith("X-Squid-Error: ERR_ACCESS_DENIED"), done


def test_squid_runs_with_the_descriptors_the_server_asked(server: RunningServer) -> None:
    asked = started(server)
    tag = asked["network"].rsplit("-", 1)[-1]
    owner = json.loads(Path(f"/run/sandbox-mcp/egress-{tag}/owner.json").read_text())
    limits = Path(f"/proc/{owner['squid_pid']}/limits").read_text()
    found = re.search(r"^Max open files\s+(\d+)\s+(\d+)", limits, re.MULTILINE)
    assert found is not None, limits
    print(f"\nSquid's descriptors (soft, hard): {found[1]}, {found[2]}; asked {asked}")
    assert asked["descriptors"] == DESCRIPTORS, asked
    assert (int(found[1]), int(found[2])) == (DESCRIPTORS, DESCRIPTORS), limits
    assert SERVER_NOFILE[0] < DESCRIPTORS  # raised above the soft limit it inherited


async def test_one_address_holds_its_share_however_many_sandboxes_and_is_told(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    asked = started(server)
    per_sandbox, per_address = asked["connections_per_sandbox"], asked["connections_per_address"]
    # Bounds smaller than the per-container limit: they, not it, are what bites here.
    assert per_sandbox < MAX_CONNECTIONS
    assert per_address == ADDRESS_SHARES * per_sandbox
    mallory = await users_from(server, HOSTILE, 3)
    (alice,) = await users_from(server, HONEST, 1)
    theirs = [await restricted(http, server, token) for token in mallory]
    ours = await restricted(http, server, alice)

    held, jobs = [], []
    for token, experiment in zip(mallory, theirs, strict=True):  # one after the other
        job = await run_command(http, server, token, experiment, HOLD, background=True)
        jobs.append(job["job_id"])
        answer = await read_when_written(http, server, token, experiment, "held")
        assert not answer["is_error"], answer
        held.append(int(answer["content"]))
    print(
        f"\nmallory's sandboxes hold {held} (bounds: {per_sandbox} a sandbox, {per_address} "
        f"an address; Squid serves {(DESCRIPTORS - 256) // 2})"
    )

    during = await run_command(http, server, alice, ours, FETCH.format(urls=[INDEX]))
    for token, job_id in zip(mallory, jobs, strict=True):
        await tool(http, server, token, "cancel_job", {"job_id": job_id})
    assert during["stdout"].strip() == f"reached {INDEX}", during
    assert held == [per_sandbox, per_sandbox, per_address - 2 * per_sandbox], held
    told = [
        await tool(http, server, token, "get_job_result", {"job_id": job_id, "wait_s": 45})
        for token, job_id in zip(mallory, jobs, strict=True)
    ]
    assert f"this sandbox's connection limit was reached ({per_sandbox} " in told[0]["stderr"]
    assert f"this sandbox's connection limit was reached ({per_sandbox} " in told[1]["stderr"]
    assert f"your sign-in address was reached ({per_address} " in told[2]["stderr"], told[2]
    assert "connection limit" not in during["stderr"], during


@pytest.fixture
def crowded(world: OutsideWorld, tmp_path: Path) -> Iterator[RunningServer]:
    """A server of its own (16 slots, Squid asked for 1,024 descriptors) for the crowd."""
    with restricted_server(
        tmp_path / "state",
        world,
        nofile=SERVER_NOFILE,
        SANDBOX_MCP_POOL_SIZE=str(CROWD_SLOTS),
        SANDBOX_MCP_QUEUE_WAIT_S="0",
        SANDBOX_MCP_TRUSTED_PROXIES="127.0.0.1",
        SANDBOX_MCP_EGRESS_PROXY_DESCRIPTORS=str(CROWD_DESCRIPTORS),
        SANDBOX_MCP_EGRESS_ADDRESS_SHARES=str(ADDRESS_SHARES),
    ) as running:
        yield running


def squid_serves(server: RunningServer) -> tuple[int, int, int]:
    """Squid's descriptor limit (read as the server checks it), its open descriptors,
    and the client connections established to it (``ss``: accepted or waiting)."""
    asked = started(server)
    tag = asked["network"].rsplit("-", 1)[-1]
    owner = json.loads(Path(f"/run/sandbox-mcp/egress-{tag}/owner.json").read_text())
    limit = open_files_limit(owner["squid_pid"])
    assert limit is not None, owner
    open_now = len(list(Path(f"/proc/{owner['squid_pid']}/fd").iterdir()))
    listening = asked["proxy"].removeprefix("http://")
    listed = subprocess.run(
        ["ss", "-Htn", "state", "established", "src", listening],
        capture_output=True,
        text=True,
        check=True,
    )
    return limit, open_now, len(listed.stdout.splitlines())


async def test_a_crowd_of_addresses_cannot_fill_squid_and_each_is_told(
    http: httpx2.AsyncClient, crowded: RunningServer
) -> None:
    server = crowded
    asked = started(server)
    per_sandbox, per_address = asked["connections_per_sandbox"], asked["connections_per_address"]
    limit, idle, _ = squid_serves(server)
    bounds = size_bounds(limit, CROWD_SLOTS, ADDRESS_SHARES)
    assert limit == CROWD_DESCRIPTORS, limit
    assert (per_sandbox, per_address) == (bounds.per_sandbox, bounds.per_address), asked
    assert per_sandbox < MAX_CONNECTIONS  # the shares bite, not the per-container limit
    # Every slot's share together fits what Squid serves: the sizing this test replays.
    assert CROWD_SLOTS * per_sandbox <= bounds.connections

    async def sign_in(address: str, count: int) -> list[tuple[str, str]]:
        return [(address, token) for token in await users_from(server, address, count)]

    signed = await asyncio.gather(
        *(sign_in(address, count) for address, count in CROWD.items()),
        *(sign_in(address, 1) for address in SIXTY_FOUR),
        sign_in(CROWD_HONEST, 1),
    )
    *mallory, ((_, alice),) = signed
    hostile = [pair for group in mallory for pair in group]
    assert len(hostile) + 1 == CROWD_SLOTS  # every slot taken, the honest one's too
    creating = asyncio.Semaphore(4)  # two cores: a few containers made at once

    async def made(token: str) -> str:
        async with creating:
            return await restricted(http, server, token)

    *theirs, ours = await asyncio.gather(*(made(t) for _, t in hostile), made(alice))

    async def holding(token: str, experiment: str) -> tuple[str, int]:
        job = await run_command(http, server, token, experiment, HOLD, background=True)
        answer = await read_when_written(http, server, token, experiment, "held")
        assert not answer["is_error"], answer
        return str(job["job_id"]), int(answer["content"])

    # All at once, but the /64's third sandbox: it asks once its two others hold theirs.
    *first, last = list(zip(hostile, theirs, strict=True))
    held = await asyncio.gather(*(holding(token, e) for (_, token), e in first))
    held.append(await holding(last[0][1], last[1]))
    jobs, counts = [job for job, _ in held], [count for _, count in held]
    _, holding_now, serving = squid_serves(server)
    by_address: dict[str, int] = {}
    for (address, _), count in zip(hostile, counts, strict=True):
        key = "2001:db8:64:64::/64" if address in SIXTY_FOUR else address
        by_address[key] = by_address.get(key, 0) + count
    print(
        f"\nthe crowd holds {counts}; by address {by_address} (bounds: {per_sandbox} a "
        f"sandbox, {per_address} an address); Squid: {serving} client connections of the "
        f"{bounds.connections} it serves, {holding_now} descriptors open of {limit} "
        f"({idle} before)"
    )

    during = await run_command(http, server, alice, ours, FETCH.format(urls=[INDEX]))
    for (_, token), job_id in zip(hostile, jobs, strict=True):
        await tool(http, server, token, "cancel_job", {"job_id": job_id})
    told = await asyncio.gather(
        *(
            tool(http, server, token, "get_job_result", {"job_id": job_id, "wait_s": 45})
            for (_, token), job_id in zip(hostile, jobs, strict=True)
        )
    )
    assert during["stdout"].strip() == f"reached {INDEX}", (during, counts, serving)
    assert "connection limit" not in during["stderr"], during
    assert counts == [per_sandbox] * (len(hostile) - 1) + [per_address - 2 * per_sandbox]
    assert max(by_address.values()) <= per_address, by_address
    # What Squid holds is what the bounds let through, room left for the honest sandbox.
    assert sum(counts) <= serving <= bounds.connections - per_sandbox, (serving, counts)
    for result in told[:-1]:
        assert f"this sandbox's connection limit was reached ({per_sandbox} " in result["stderr"], (
            result
        )
    assert f"your sign-in address was reached ({per_address} " in told[-1]["stderr"], told[-1]


async def test_a_sandbox_has_one_daily_budget_however_many_experiments_it_makes(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    assert BIG_BYTES < DAY_BYTES < 2 * BIG_BYTES  # one download fits, two do not
    bob, carol = await users_from(server, "192.0.2.30", 2)
    fetch = FETCH.format(urls=[BIG])
    results, made = [], []
    for _ in range(3):  # each experiment of its own, each far under its own cap
        experiment = await restricted(http, server, bob, "files.pythonhosted.org")
        made.append(experiment)
        results.append(await run_command(http, server, bob, experiment, fetch))
    # Deleting them resets nothing either.
    for experiment in made:
        gone = await tool(http, server, bob, "destroy_experiment", {"experiment_id": experiment})
        assert not gone["is_error"], gone
    after = await restricted(http, server, bob, "files.pythonhosted.org")
    results.append(await run_command(http, server, bob, after, fetch))
    theirs = await restricted(http, server, carol, "files.pythonhosted.org")
    other = await run_command(http, server, carol, theirs, fetch)
    print("\n" + "\n".join(r["stdout"].strip() for r in results), f"\nother: {other['stdout']}")

    assert results[0]["stdout"].strip() == f"reached {BIG}", results[0]
    told = [i for i, r in enumerate(results) if "EGRESS_BUDGET_REACHED" in r["stderr"]]
    assert told == [1], results  # once, to the experiment that crossed it
    told_text = results[1]["stderr"]
    assert f"daily egress budget ({DAY_BYTES:,} bytes" in told_text, told_text
    assert results[2]["stdout"].startswith(f"failed {BIG}"), results[2]
    assert results[3]["stdout"].startswith(f"failed {BIG}"), results[3]
    assert other["stdout"].strip() == f"reached {BIG}", other  # another sandbox's budget
