"""Benchmark: honest tenants beside hostile ones, against a run without the hostile ones.

Prints figures, asserts nothing. One real server (loopback, OAuth with the
production sign-in budgets and shares, real Docker), HONEST honest tenants, each
signing in from an address of its own (as a trusted proxy would say, in
X-Forwarded-For) and then running normal sessions (create an experiment, write a
file, run a command, search, read; then a restricted experiment fetching a package
index through the shared proxy, its fetch timed as one more honest call), measured
twice in the same run:

1. alone (the floor);
2. beside the attacks of issues 12 and 23, each against the fixed server:
   catastrophic regexes and globs, background-job floods, commands printing
   megabytes (HOSTILE tenants); floods of the command's executor's stream
   (``{"id":987654321}`` lines, and one byte at a time with no newline); hostile
   JUnit reports (19 MB nested 6 million deep, and 19 MB of namespaced elements);
   a flood of refused calls from one sandbox; sign-ins and registrations from
   FLOOD_NETWORKS networks (many /64s each) and junk sign-in POSTs; 4 MiB
   request bodies from one address; and against the one Squid every restricted
   tenant shares: HOARDERS sandboxes (an address each) holding all the connections
   they can get from as many restricted experiments as they may have, one sandbox
   downloading over and over past its daily byte budget, one probing the cache
   manager in every form; a sandbox filling its ``dir`` slot past DISK_BUDGET_MB, in
   turn with one ``posix_fallocate`` of 1 GiB and with a writer that kills its job's
   supervisor, waits past a check interval and then writes (issue 23, finding 6); and
   sign-in pages from FLOOD_NETWORKS networks naming metadata documents at numeric
   host names (``https://2130706433/...``, ``https://127.10.0/...``: finding 8), which
   must be refused before any fetch budget is spent.

The outside world is ``egress_testkit``'s registry (a network namespace, built images
trusting its CA); Squid is asked for EGRESS_DESCRIPTORS, so that the hoarders' bound
(a slot's share) is smaller than the per-container limit and is what holds them.

Meanwhile /health is timed, and each honest sign-in's OAuth requests (discovery,
/register, /authorize, /token, and a refresh once its sessions are done); and
DOCUMENT_CLIENTS new clients a run sign in with a metadata document of their own
(served over TLS from DOCUMENT_ADDRESS, added to lo for the run and removed after;
the server trusts a throwaway CA through SSL_CERT_FILE), each whole sign-in timed.
For each run: the honest calls' p50, p95 and p99, their errors, the honest sign-ins
refused, the attackers' calls refused and accepted (by attack); at the end the
OAuth endpoints' p50, p95 and p99 quiet and attacked side by side (issue 25 asks for the
p99), discovery's, registration's, token's and refresh's beside claude.ai's limits
for them (10 s, and 30 s for a refresh), the ratios attacked/alone, the documents
the server fetched (the honest clients' only, if the numeric names spent nothing),
and the server's warnings by event (a disk kill that failed says why). The stopped
server keeps its live experiments' containers for its next start; the bench removes
them, its restricted network and the address on lo, leaving nothing behind.

An honest registration refused is counted and the tenant signs in with a client
registered before the runs; a sign-in refused is counted and leaves the tenant
without a token (it runs no session). Honest errors are printed by tool and code.

Bounded for 2 shared cores: 10 honest and 6 general hostile tenants (not 20 and
20), 2 sessions each; the attackers stop when the honest tenants are done, and each
watch of a disk writer within WRITER_WAIT_S (about 5 minutes in all on a machine
busy with other work). Run as root (the address on lo, port 443).

    uv run python tests/bench/bench_fairness.py
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx2

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))
sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))

from disk_budget_testkit import code_of
from e2e_server import DEFAULT_SHARES, RunningServer, start_server, stop_server
from egress_testkit import (
    BIG_FILE,
    FETCH,
    hold,
    outside_world,
    remove_restricted_network,
)
from mcp_http import read_when_written, rpc_request, run_command, tool, write_file
from oauth_browser import REDIRECT_URI, ManualClient, pkce_pair, query_of, read_page
from test_disk_budget_fallocate_over_http import POSIX as FALLOCATE
from test_executor_stream_flood_over_http import FLOOD
from test_hostile_reports_over_http import HOSTILE as DEEP_REPORTS
from test_hostile_reports_over_http import NAMESPACED
from test_oauth_client_documents import NUMERIC_HOSTS, authorize_params
from test_restricted_egress_shared_proxy_over_http import ASK, FORMS, INDEX
from tls_testkit import Answer, DocumentServer, make_ca

from app.experiments.disk_budget import measure_tree

HONEST = 10
HOSTILE = 6  # the general attackers (regexes, globs, job floods, big output)
ROUNDS = 2  # sessions per honest tenant and run
FLOOD_NETWORKS = 8  # IPv6 /48s signing in and registering; each may take 10% of the hour
HOARDERS = 3  # sandboxes holding connections to the proxy, an address each
HOARD = hold(200, 900, begin_request=True)  # kept until cancelled at the run's end
BIG = f"https://files.pythonhosted.org/packages/{BIG_FILE}"
EGRESS_DESCRIPTORS = 2048  # Squid's: (2048 - 256) // 2 // slots, under 64 a container
DAY_BYTES = 16 * 1024**2  # a sandbox's egress budget here: the spender reaches it
BODY = b"[" + b"{}," * (4 * 1024 * 1024 // 3 - 1) + b"{}]"  # 4 MiB of empty messages
# Every sandbox's dir slot budget here (the production 1 GiB would write a few GiB to a
# shared machine's disk a run); the reports attacker's 19 MB reports fit. The check
# interval is the production one.
DISK_BUDGET_MB = 128
DISK_CHECK_INTERVAL_S = 2.0
WRITER_PAUSE_S = 2.5 * DISK_CHECK_INTERVAL_S  # no growth at one measurement, then growth
WRITER_MB = 2 * DISK_BUDGET_MB  # what the escaped writer means to write, a file a MB
WRITER_WAIT_S = 60.0  # the most one watch of a writer lasts (about 13 s if never stopped)
# Another address of the retired 6to4 prefix than test_oauth_client_documents's
# 192.88.99.1, so that the bench and that module may run at once.
DOCUMENT_ADDRESS = "192.88.99.2"
DOCUMENT_CLIENTS = 10  # new clients a run signing in with a metadata document

REDOS = "(a+)+$"
GLOB_BOMB = "*a*a*a*a*a*a*a*a*a*a*b"
# The stream test's flood (its mode "unknown-id": lines of an id nobody asked for), and
# a variant of its no-newline mode writing one byte at a time (mode "one-byte").
STREAM_FLOODS = {"unknown-id": FLOOD, "one-byte": FLOOD.replace('b"x" * 65536', 'b"x"')}
REPORTS = {"deep": DEEP_REPORTS["MAX_DEPTH"], "namespaced": NAMESPACED}
# test_disk_budget_writer_outside_job_over_http's writer: detached from the job, it
# waits WRITER_PAUSE_S, then writes WRITER_MB a file a MB (RLIMIT_FSIZE stops one file
# only) and says "done"; the job's supervisor (the command's parent) is killed, so the
# job ends at once and the writer runs on under the container's PID 1.
ESCAPE = (
    f"( sleep {WRITER_PAUSE_S}; i=0; while [ $i -lt {WRITER_MB} ]; do "
    "head -c 1048576 /dev/zero > f$i; i=$((i+1)); sleep 0.05; done; touch done ) "
    "</dev/null >/dev/null 2>&1 & sleep 0.2; kill -9 $PPID"
)

Tally = defaultdict[str, Counter[str]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:.0f}"


def error_code(result: dict[str, Any]) -> str:
    return str((result.get("error") or {}).get("code", "?"))


def honest_address(n: int) -> str:
    return f"2001:db8:a{n:x}::1"  # a /48 of its own


def forwarded(address: str) -> dict[str, str]:
    return {"x-forwarded-for": address}


async def timed(
    http: httpx2.AsyncClient, server: RunningServer, token: str, name: str, args: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    try:
        result = await tool(http, server, token, name, args)
    except (AssertionError, httpx2.HTTPError) as exc:
        result = {"is_error": True, "error": {"code": type(exc).__name__}}
    return time.perf_counter() - started, result


class Measured:
    """One run's figures."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self.health: list[float] = []
        self.oauth: defaultdict[str, list[float]] = defaultdict(list)
        self.errors = 0
        self.signins_refused = 0  # honest tenants left without a token
        self.refusals: Counter[str] = Counter()  # honest OAuth steps refused: step and status
        self.by_tool: defaultdict[str, list[float]] = defaultdict(list)
        self.error_codes: Counter[str] = Counter()  # honest calls' errors: tool and code
        self.attacks: Tally = defaultdict(Counter)

    async def http_timed(
        self, kind: str, request: Awaitable[httpx2.Response]
    ) -> httpx2.Response | None:
        started = time.perf_counter()
        try:
            response = await request
        except httpx2.HTTPError:
            response = None
        self.oauth[kind].append(time.perf_counter() - started)
        return response

    def refused(self, step: str, response: httpx2.Response | None) -> None:
        self.refusals[f"{step} {response.status_code if response else 'failed'}"] += 1

    def call(self, name: str, seconds: float, result: dict[str, Any]) -> bool:
        """Records an honest call; whether it failed."""
        self.calls.append(seconds)
        self.by_tool[name].append(seconds)
        if result.get("is_error"):
            self.errors += 1
            self.error_codes[f"{name} {error_code(result)}"] += 1
        return bool(result.get("is_error"))


async def honest_sign_in(
    http: httpx2.AsyncClient, server: RunningServer, n: int, fallback: ManualClient, m: Measured
) -> tuple[ManualClient, dict[str, str]] | None:
    """A new user's sign-in from its own address, as claude.ai does it: discovery, its
    own registration (on refusal: the fallback client, the refusal counted), the
    sign-in page and its button, the code redeemed. The client and its tokens, or None."""
    headers = forwarded(honest_address(n))
    base = server.base_url
    await m.http_timed(
        "discovery",
        http.get(f"{base}/.well-known/oauth-authorization-server", headers=headers),
    )
    registered = await m.http_timed(
        "register",
        http.post(
            f"{base}/register",
            json={"redirect_uris": [REDIRECT_URI], "client_name": f"honest {n}"},
            headers=headers,
        ),
    )
    client = fallback
    if registered is not None and registered.status_code == 201:
        client = ManualClient(base, registered.json()["client_id"])
    else:
        m.refused("register", registered)
    verifier, challenge = pkce_pair()
    page_answer = await m.http_timed(
        "authorize", http.get(client.authorize_url(challenge), headers=headers)
    )
    if page_answer is None or page_answer.status_code != 200:
        m.refused("sign-in page", page_answer)
        return None
    page = read_page(page_answer)
    pressed = await m.http_timed(
        "authorize",
        http.post(
            f"{base}/authorize",
            data={"tx": page.tx, "csrf": page.csrf},
            headers={"cookie": f"{page.cookie_name}={page.cookie}", **headers},
        ),
    )
    if pressed is None or pressed.status_code != 303:
        m.refused("sign-in button", pressed)
        return None
    code = query_of(pressed.headers["location"])["code"]
    tokens = await m.http_timed("token", client.exchange(http, code, verifier))
    if tokens is None or tokens.status_code != 200:
        m.refused("token", tokens)
        return None
    return client, dict(tokens.json())


def document_address(n: int) -> str:
    return f"2001:db8:d{n:x}::1"  # a /48 of its own, apart from the honest_address ones


async def document_sign_in(
    http: httpx2.AsyncClient,
    server: RunningServer,
    documents: DocumentServer,
    name: str,
    n: int,
    m: Measured,
) -> None:
    """A new client that signs in with its own metadata document (never seen: the
    server fetches it), from its own address: the sign-in page (the fetch), its button
    and the code redeemed, timed as one "document sign-in". Each refusal counted."""
    path = f"/clients/{name}.json"
    url = f"https://{DOCUMENT_ADDRESS}{path}"
    document = {"client_id": url, "client_name": f"Bench {name}", "redirect_uris": [REDIRECT_URI]}
    documents.answers[path] = Answer(
        body=json.dumps(document).encode(), headers={"Cache-Control": "max-age=300"}
    )
    client = ManualClient(server.base_url, url)
    headers = forwarded(document_address(n))
    verifier, challenge = pkce_pair()
    started = time.perf_counter()
    try:
        page_answer = await http.get(client.authorize_url(challenge), headers=headers)
        # The page alone too: the server fetched the document before answering it.
        m.oauth["document page"].append(time.perf_counter() - started)
        if page_answer.status_code != 200:
            m.refused("document sign-in page", page_answer)
            return
        page = read_page(page_answer)
        pressed = await http.post(
            f"{server.base_url}/authorize",
            data={"tx": page.tx, "csrf": page.csrf},
            headers={"cookie": f"{page.cookie_name}={page.cookie}", **headers},
        )
        if pressed.status_code != 303:
            m.refused("document sign-in button", pressed)
            return
        code = query_of(pressed.headers["location"])["code"]
        tokens = await client.exchange(http, code, verifier)
        if tokens.status_code != 200:
            m.refused("document token", tokens)
            return
    except httpx2.HTTPError:
        m.refused("document sign-in", None)
        return
    m.oauth["document sign-in"].append(time.perf_counter() - started)


RESTRICTED = {"network": "restricted", "egress_allowlist": ["pypi.org"]}


async def honest_session(
    http: httpx2.AsyncClient, server: RunningServer, token: str, m: Measured
) -> None:
    """One normal session."""
    seconds, created = await timed(
        http, server, token, "create_experiment", {"files": {"app.py": "print('hi')\n"}}
    )
    if m.call("create_experiment", seconds, created):
        return
    exp = created["experiment_id"]
    steps: list[tuple[str, dict[str, Any]]] = [
        ("write_sandbox_file", {"experiment_id": exp, "path": "notes.txt", "content": "a\n" * 50}),
        ("execute_experiment", {"experiment_id": exp, "command": "python3 app.py"}),
        ("search_sandbox", {"experiment_id": exp, "pattern": "print"}),
        ("read_sandbox_file", {"experiment_id": exp, "path": "notes.txt"}),
        ("sandbox_status", {}),
        ("destroy_experiment", {"experiment_id": exp}),
    ]
    for name, args in steps:
        seconds, result = await timed(http, server, token, name, args)
        m.call(name, seconds, result)
    seconds, made = await timed(http, server, token, "create_experiment", RESTRICTED)
    if m.call("create (restricted)", seconds, made):
        return
    exp = made["experiment_id"]
    fetch = {"experiment_id": exp, "command": FETCH.format(urls=[INDEX])}
    seconds, fetched = await timed(http, server, token, "execute_experiment", fetch)
    if not fetched.get("is_error") and fetched.get("stdout", "").strip() != f"reached {INDEX}":
        # The command ran but the proxy did not serve it: the honest failure counted.
        fetched = {"is_error": True, "error": {"code": "FETCH_FAILED"}}
    m.call("restricted fetch", seconds, fetched)
    seconds, result = await timed(http, server, token, "destroy_experiment", {"experiment_id": exp})
    m.call("destroy_experiment", seconds, result)


# The attackers: each runs until ``stop`` and counts its calls in ``tally[kind]``.
Attack = Callable[
    [httpx2.AsyncClient, RunningServer, str, asyncio.Event, Tally], Coroutine[Any, Any, None]
]


async def general(
    http: httpx2.AsyncClient, server: RunningServer, token: str, stop: asyncio.Event, tally: Tally
) -> None:
    """An experiment, then regexes, globs, job floods and big output in turn."""
    _, created = await timed(
        http,
        server,
        token,
        "create_experiment",
        {"files": {"bomb.txt": "a" * 5000 + "!\n", ("a" * 120) + ".txt": "x"}},
    )
    if created.get("is_error"):
        tally["general"]["refused"] += 1
        return
    exp = created["experiment_id"]
    attacks: list[tuple[str, dict[str, Any]]] = [
        ("search_sandbox", {"experiment_id": exp, "pattern": REDOS}),
        ("collect_artifacts", {"experiment_id": exp, "patterns": [GLOB_BOMB]}),
        ("execute_experiment", {"experiment_id": exp, "command": "sleep 30", "background": True}),
        (
            "execute_experiment",
            {"experiment_id": exp, "command": "head -c 5000000 /dev/zero | tr '\\0' a"},
        ),
    ]
    turn = len(token)
    while not stop.is_set():
        name, args = attacks[turn % len(attacks)]
        turn += 1
        _, result = await timed(http, server, token, name, args)
        tally["general"]["refused" if result.get("is_error") else "accepted"] += 1


def stream_flood(mode: str) -> Attack:
    """A command writing to its executor's stdout; each flood costs the executor, so
    a new experiment (with a new executor) each time."""

    async def attack(
        http: httpx2.AsyncClient,
        server: RunningServer,
        token: str,
        stop: asyncio.Event,
        tally: Tally,
    ) -> None:
        counts = tally[f"executor stream ({mode})"]
        while not stop.is_set():
            created = await tool(
                http,
                server,
                token,
                "create_experiment",
                {"files": {"flood.py": STREAM_FLOODS[mode]}},
            )
            if created["is_error"]:
                counts["refused"] += 1
                await asyncio.sleep(1)
                continue
            exp = str(created["experiment_id"])
            while not stop.is_set():  # until its executor serves (started in the background)
                where = await run_command(http, server, token, exp, "python3 flood.py where")
                if where.get("stdout") == "fast\n":
                    break
                await asyncio.sleep(0.2)
            job = await run_command(
                http, server, token, exp, f"python3 flood.py {mode} 8", background=True
            )
            if not job["is_error"]:
                ended = await tool(
                    http, server, token, "get_job_result", {"job_id": job["job_id"], "wait_s": 30}
                )
                # "lost": the server closed the executor's session (the fix).
                counts[str(ended.get("status") or error_code(ended))] += 1
            else:
                counts[f"not started: {error_code(job)}"] += 1
            await tool(http, server, token, "destroy_experiment", {"experiment_id": exp})

    return attack


async def reports(
    http: httpx2.AsyncClient, server: RunningServer, token: str, stop: asyncio.Event, tally: Tally
) -> None:
    """run_tests over and over, in turn in a sandbox whose conftest.py writes a 19 MB
    report nested 6 million deep and one of 19 MB of namespaced elements."""
    experiments = []
    for conftest in REPORTS.values():
        files = {
            "conftest.py": conftest,
            "tests/test_ok.py": "def test_ok():\n    pass\n",
            "pyproject.toml": "[tool.pytest.ini_options]\n",
        }
        created = await tool(http, server, token, "create_experiment", {"files": files})
        if not created["is_error"]:
            experiments.append(created["experiment_id"])
    turn = 0
    while experiments and not stop.is_set():
        _, result = await timed(
            http, server, token, "run_tests", {"experiment_id": experiments[turn % 2]}
        )
        turn += 1
        capped = any("(cap " in note for note in result.get("tests", {}).get("notes", []))
        tally["junit reports"]["capped" if capped else "not capped"] += 1


async def refusals(
    http: httpx2.AsyncClient, server: RunningServer, token: str, stop: asyncio.Event, tally: Tally
) -> None:
    """get_experiment of an unknown id, 16 at a time, from one sandbox."""

    async def one() -> None:
        while not stop.is_set():
            _, result = await timed(
                http, server, token, "get_experiment", {"experiment_id": "nope"}
            )
            tally["refused calls"]["refused" if result.get("is_error") else "accepted"] += 1

    await asyncio.gather(*(one() for _ in range(16)))


async def bodies(
    http: httpx2.AsyncClient, server: RunningServer, token: str, stop: asyncio.Event, tally: Tally
) -> None:
    """4 MiB bodies of empty messages to /mcp, two at a time, from one address."""
    headers = rpc_request("tools/list", {}, token=token)["headers"]

    async def one() -> None:
        while not stop.is_set():
            try:
                answer = await http.post(server.mcp_url, content=BODY, headers=headers)
                tally["4 MiB bodies"][str(answer.status_code)] += 1
            except httpx2.HTTPError as exc:
                tally["4 MiB bodies"][type(exc).__name__] += 1

    await asyncio.gather(one(), one())


async def signin_flood(
    http: httpx2.AsyncClient,
    server: RunningServer,
    client: ManualClient,
    stop: asyncio.Event,
    tally: Tally,
) -> None:
    """Registrations and sign-ins (page and button; the codes held, never redeemed)
    from FLOOD_NETWORKS /48s, a new /64 each time, and junk sign-in POSTs."""
    base = server.base_url
    turn = 0

    async def one(address: str) -> None:
        headers = forwarded(address)
        registered = await http.post(
            f"{base}/register",
            json={"redirect_uris": [REDIRECT_URI], "client_name": "flood"},
            headers=headers,
        )
        tally["registrations"]["accepted" if registered.status_code == 201 else "refused"] += 1
        _, challenge = pkce_pair()
        page_answer = await http.get(client.authorize_url(challenge), headers=headers)
        if page_answer.status_code != 200:
            tally["sign-ins"]["refused"] += 1
            return
        page = read_page(page_answer)
        pressed = await http.post(
            f"{base}/authorize",
            data={"tx": page.tx, "csrf": page.csrf},
            headers={"cookie": f"{page.cookie_name}={page.cookie}", **headers},
        )
        tally["sign-ins"]["accepted" if pressed.status_code == 303 else "refused"] += 1
        junk = await http.post(f"{base}/authorize", data={"tx": "x", "csrf": "y"}, headers=headers)
        tally["junk sign-in POSTs"]["accepted" if junk.status_code < 400 else "refused"] += 1

    while not stop.is_set():
        batch = [
            f"2001:db8:f{network:x}:{turn + host:x}::1"
            for network in range(FLOOD_NETWORKS)
            for host in range(2)
        ]
        turn += 2
        for outcome in await asyncio.gather(*(one(a) for a in batch), return_exceptions=True):
            if isinstance(outcome, BaseException):
                tally["sign-ins"][type(outcome).__name__] += 1


async def hoard(
    http: httpx2.AsyncClient, server: RunningServer, token: str, stop: asyncio.Event, tally: Tally
) -> None:
    """Restricted experiments, as many as the sandbox may have, each holding all the
    connections to the proxy it can get until the run ends; then told or not."""
    counts = tally["proxy connections (hoarders)"]
    held: list[tuple[str, str]] = []
    while len(held) < 4 and not stop.is_set():
        created = await tool(http, server, token, "create_experiment", RESTRICTED)
        if created["is_error"]:
            counts[f"experiment refused {error_code(created)}"] += 1
            break
        exp = str(created["experiment_id"])
        job = await run_command(http, server, token, exp, HOARD, background=True)
        if job["is_error"]:
            counts[f"not started {error_code(job)}"] += 1
            continue
        held.append((exp, str(job["job_id"])))
        answer = await read_when_written(http, server, token, exp, "held")
        counts["held"] += 0 if answer["is_error"] else int(answer["content"])
    await stop.wait()
    for exp, job_id in held:
        await tool(http, server, token, "cancel_job", {"job_id": job_id})
        ended = await tool(http, server, token, "get_job_result", {"job_id": job_id, "wait_s": 30})
        counts["told" if "connection limit" in str(ended.get("stderr")) else "not told"] += 1
        await tool(http, server, token, "destroy_experiment", {"experiment_id": exp})


async def spend_bytes(
    http: httpx2.AsyncClient, server: RunningServer, token: str, stop: asyncio.Event, tally: Tally
) -> None:
    """Downloads of the registry's 1.5 MiB file, four a command, over and over, a new
    experiment each time (the day's budget is the sandbox's, not the experiment's)."""
    counts = tally["egress bytes (spender)"]
    allow = {"network": "restricted", "egress_allowlist": ["files.pythonhosted.org"]}
    while not stop.is_set():
        created = await tool(http, server, token, "create_experiment", allow)
        if created["is_error"]:
            counts[f"experiment refused {error_code(created)}"] += 1
            await asyncio.sleep(1)
            continue
        exp = str(created["experiment_id"])
        done = await run_command(http, server, token, exp, FETCH.format(urls=[BIG] * 4))
        for line in str(done.get("stdout", "")).splitlines():
            counts[line.split(" ", 1)[0]] += 1  # "reached" or "failed"
        if "EGRESS_BUDGET_REACHED" in str(done.get("stderr", "")):
            counts["told"] += 1
        await tool(http, server, token, "destroy_experiment", {"experiment_id": exp})


async def probe_manager(
    http: httpx2.AsyncClient, server: RunningServer, token: str, stop: asyncio.Event, tally: Tally
) -> None:
    """Squid's cache manager, its internal pages, TRACE and OPTIONS, in turn."""
    counts = tally["proxy manager probes"]
    created = await tool(http, server, token, "create_experiment", RESTRICTED)
    if created["is_error"]:
        counts[f"experiment refused {error_code(created)}"] += 1
        return
    exp = str(created["experiment_id"])
    turn = 0
    while not stop.is_set():
        form = sorted(FORMS)[turn % len(FORMS)]
        turn += 1
        done = await run_command(http, server, token, exp, ASK.format(request=FORMS[form]))
        said = dict(
            line.split(" ", 1) for line in str(done.get("stdout", "")).splitlines() if " " in line
        )
        if said.get("manager-says") == "True":
            counts[f"MANAGER ANSWERED {form}"] += 1
        else:
            counts[said.get("status", "no answer").removeprefix("HTTP/1.1 ")[:3]] += 1


def experiment_mb(state: Path, exp: str) -> float:
    """The MB an experiment's folder in its dir slot allocates, as the budget counts them
    (0 once it is gone)."""
    for depth in ("*", "*/*", "*/*/*"):  # a slot's folder may be spread into subfolders
        for root in (state / "slots").glob(f"{depth}/exp-{exp}"):
            return measure_tree(root, 1_000_000).bytes / 1_048_576
    return 0.0


async def watch_writer(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    exp: str,
    state: Path,
    stop: asyncio.Event,
) -> tuple[str, float]:
    """Read-only calls (which measure nothing) until the escaped writer says it is done,
    or its experiment has not grown for two check intervals since it began to: how it
    ended, and the most MB the experiment held meanwhile. Bounded by WRITER_WAIT_S."""
    deadline = time.monotonic() + WRITER_WAIT_S
    first = last = peak = await asyncio.to_thread(experiment_mb, state, exp)
    quiet_since = time.monotonic()
    while time.monotonic() < deadline and not stop.is_set():
        done = await tool(
            http, server, token, "read_sandbox_file", {"experiment_id": exp, "path": "done"}
        )
        if not done["is_error"]:
            return "finished (NEVER STOPPED)", peak
        now = await asyncio.to_thread(experiment_mb, state, exp)
        peak = max(peak, now)
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif last > first and time.monotonic() - quiet_since >= 2 * DISK_CHECK_INTERVAL_S:
            return "stopped", peak
        await asyncio.sleep(0.5)
    return "still watched at the end" if stop.is_set() else "watch timed out", peak


def fill_disk(state: Path) -> Attack:
    """A sandbox filling its dir slot, a new experiment each time: in turn one
    posix_fallocate of 1 GiB, and the writer that leaves its job, pauses past a check
    interval and then writes. The most MB one experiment held (the budget is
    DISK_BUDGET_MB), and whether the next write was refused."""

    async def attack(
        http: httpx2.AsyncClient,
        server: RunningServer,
        token: str,
        stop: asyncio.Event,
        tally: Tally,
    ) -> None:
        counts = tally["disk budget (dir slot)"]
        turn = 0
        while not stop.is_set():
            created = await tool(http, server, token, "create_experiment", {"name": "disk"})
            if created["is_error"]:
                counts[f"experiment refused {error_code(created)}"] += 1
                await asyncio.sleep(1)
                continue
            exp = str(created["experiment_id"])
            if turn % 2 == 0:
                done = await run_command(http, server, token, exp, FALLOCATE)
                counts[f"posix_fallocate exit {done.get('exit_code', error_code(done))}"] += 1
                peak = await asyncio.to_thread(experiment_mb, state, exp)
                which = "posix_fallocate"
            else:
                await run_command(http, server, token, exp, ESCAPE)
                ended, peak = await watch_writer(http, server, token, exp, state, stop)
                counts[f"writer {ended}"] += 1
                which = "writer"
            key = f"most MB held after a {which}"
            counts[key] = max(counts[key], round(peak))
            more = await write_file(http, server, token, exp, "more", "x")
            counts[f"next write {code_of(more) or 'accepted'}"] += 1
            await tool(http, server, token, "destroy_experiment", {"experiment_id": exp})
            turn += 1

    return attack


async def numeric_documents(
    http: httpx2.AsyncClient, server: RunningServer, stop: asyncio.Event, tally: Tally
) -> None:
    """Sign-in pages whose client_id is a metadata document at a numeric host name (or a
    name that is no domain name), a new URL each, from FLOOD_NETWORKS /48s, a new /64
    each time, 16 at once. Each must be refused unfetched, spending no fetch budget."""
    counts = tally["numeric-host documents"]
    number = 0

    async def one(n: int, address: str) -> None:
        host = NUMERIC_HOSTS[n % len(NUMERIC_HOSTS)]
        page = await http.get(
            f"{server.base_url}/authorize",
            params=authorize_params(f"https://{host}/flood-{n}.json"),
            headers=forwarded(address),
        )
        if page.status_code == 400 and "is never fetched" in page.text:
            counts["refused unfetched"] += 1
        elif "Too many new applications" in page.text:
            counts["BUDGET SPENT"] += 1
        else:
            counts[f"other {page.status_code}"] += 1

    while not stop.is_set():
        batch = [
            (number + k, f"2001:db8:e{k % FLOOD_NETWORKS:x}:{number + k:x}::1")
            for k in range(2 * FLOOD_NETWORKS)
        ]
        number += len(batch)
        for outcome in await asyncio.gather(*(one(*a) for a in batch), return_exceptions=True):
            if isinstance(outcome, BaseException):
                counts[type(outcome).__name__] += 1


# The attackers with a token each (fill_disk is added by measure: it reads the state dir).
ATTACKERS: list[Attack] = [general] * HOSTILE + [
    *(stream_flood(mode) for mode in STREAM_FLOODS),
    reports,
    refusals,
    bodies,
    *[hoard] * HOARDERS,
    spend_bytes,
    probe_manager,
]


async def health(
    http: httpx2.AsyncClient, server: RunningServer, stop: asyncio.Event, m: Measured
) -> None:
    """/health every 0.2 s; its failures count as honest errors."""
    while not stop.is_set():
        started = time.perf_counter()
        try:
            status = str((await http.get(f"{server.base_url}/health")).status_code)
        except httpx2.HTTPError as exc:
            status = type(exc).__name__
        m.health.append(time.perf_counter() - started)
        if status != "200":
            m.errors += 1
            m.error_codes[f"/health {status}"] += 1
        await asyncio.sleep(0.2)


async def run(
    server: RunningServer,
    fallback: ManualClient,
    documents: DocumentServer,
    attackers: list[tuple[Attack, str]],
) -> Measured:
    """One run: the honest tenants and document clients, beside ``attackers`` (each
    with its token; with any, the sign-in and numeric-document floods too)."""
    m = Measured()
    name = "attacked" if attackers else "alone"  # the document clients' URLs: new each run
    stop = asyncio.Event()
    limits = httpx2.Limits(max_connections=300)
    async with httpx2.AsyncClient(timeout=120, limits=limits) as http:
        background = [asyncio.create_task(health(http, server, stop, m))]
        if attackers:
            background += [
                asyncio.create_task(attack(http, server, token, stop, m.attacks))
                for attack, token in attackers
            ]
            background += [
                asyncio.create_task(signin_flood(http, server, fallback, stop, m.attacks)),
                asyncio.create_task(numeric_documents(http, server, stop, m.attacks)),
            ]
            await asyncio.sleep(5)  # let the attacks start first
        started = time.perf_counter()

        async def tenant(n: int) -> None:
            signed_in = await honest_sign_in(http, server, n, fallback, m)
            if signed_in is None:
                m.signins_refused += 1
                return
            client, tokens = signed_in
            for _ in range(ROUNDS):
                await honest_session(http, server, tokens["access_token"], m)
            refreshed = await m.http_timed("refresh", client.refresh(http, tokens["refresh_token"]))
            if refreshed is None or refreshed.status_code != 200:
                m.refused("refresh", refreshed)

        async def document_client(n: int) -> None:
            await asyncio.sleep(n)  # one a second, while the sessions run
            await document_sign_in(http, server, documents, f"{name}-{n}", n, m)

        await asyncio.gather(
            *(tenant(n) for n in range(HONEST)),
            *(document_client(n) for n in range(DOCUMENT_CLIENTS)),
        )
        elapsed = time.perf_counter() - started
        stop.set()
        for outcome in await asyncio.gather(*background, return_exceptions=True):
            if isinstance(outcome, BaseException):
                m.attacks["attacker crashed"][type(outcome).__name__] += 1
    label = (
        f"beside {len(attackers)} attackers + sign-in and numeric-document floods"
        if attackers
        else "alone (floor)"
    )
    print(f"\n{label}: {len(m.calls)} honest calls in {elapsed:.1f} s")
    print(
        f"  honest calls: p50 {ms(m.calls, 0.5)} ms, p95 {ms(m.calls, 0.95)} ms, "
        f"p99 {ms(m.calls, 0.99)} ms; errors {m.errors}; "
        f"honest tenants refused a sign-in {m.signins_refused} of {HONEST}; "
        f"honest OAuth steps refused: {dict(m.refusals) or 0}"
    )
    if m.error_codes:
        print(f"  honest errors: {dict(m.error_codes)}")
    for tool_name, values in m.by_tool.items():
        print(f"    {tool_name:<20} p50 {ms(values, 0.5):>6} ms, p99 {ms(values, 0.99):>6} ms")
    for kind, values in (("/health", m.health), *m.oauth.items()):
        print(
            f"  {kind:<16} n {len(values):4d}: p50 {ms(values, 0.5)} ms, "
            f"p99 {ms(values, 0.99)} ms, max {max(values, default=0) * 1000:.0f} ms"
        )
    for kind, counts in sorted(m.attacks.items()):
        print(f"  attackers, {kind}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return m


# The OAuth requests side by side (issue 25 asks for their p99 under attack): the
# endpoints, and a new client's whole sign-in with a metadata document.
OAUTH_ROWS = (
    ("discovery", "GET /.well-known/oauth-authorization-server"),
    ("register", "POST /register"),
    ("authorize", "GET and POST /authorize"),
    ("token", "POST /token (code)"),
    ("refresh", "POST /token (refresh)"),
    ("document page", "GET /authorize (a new document fetched)"),
    ("document sign-in", "a document client's whole sign-in"),
)
# claude.ai gives up on a discovery, registration or token request after 10 s, and on
# a refresh after 30 s (issue 25): each p99 is printed beside its client's limit.
CLIENT_LIMIT_S = {"discovery": 10.0, "register": 10.0, "token": 10.0, "refresh": 30.0}


def oauth_table(alone: Measured, attacked: Measured) -> None:
    print("\nOAuth, honest requests, ms (quiet: alone; attacked: beside every attacker):")
    print(
        f"  {'':<44} {'n':>4} {'quiet p50':>9} {'p95':>6} {'p99':>6} | "
        f"{'n':>4} {'attacked p50':>12} {'p95':>6} {'p99':>6} | client limit"
    )
    for kind, label in OAUTH_ROWS:
        before, after = alone.oauth[kind], attacked.oauth[kind]
        print(
            f"  {label:<44} {len(before):>4} {ms(before, 0.5):>9} {ms(before, 0.95):>6} "
            f"{ms(before, 0.99):>6} | {len(after):>4} {ms(after, 0.5):>12} "
            f"{ms(after, 0.95):>6} {ms(after, 0.99):>6} | {limit_of(kind, after)}"
        )


def limit_of(kind: str, attacked: list[float]) -> str:
    """The client's limit for ``kind`` and whether the attacked p99 is within it."""
    limit = CLIENT_LIMIT_S.get(kind)
    if limit is None:
        return "-"
    if not attacked:
        return f"{limit:.0f} s (no requests)"
    p99 = percentile(attacked, 0.99)
    verdict = "within" if p99 < limit else "OVER"
    return f"{limit:.0f} s: p99 {verdict} ({p99 / limit:.1%} of it)"


def ratios(alone: Measured, attacked: Measured) -> None:
    print("\nattacked/alone:")
    rows = [
        ("honest calls", alone.calls, attacked.calls),
        ("/health", alone.health, attacked.health),
    ]
    rows += [(kind, alone.oauth[kind], attacked.oauth[kind]) for kind in alone.oauth]
    for name, before, after in rows:
        print(
            f"  {name:<16} p50 {percentile(after, 0.5) / percentile(before, 0.5):6.2f}, "
            f"p99 {percentile(after, 0.99) / percentile(before, 0.99):6.2f}"
        )


async def sign_in_from(http: httpx2.AsyncClient, client: ManualClient, address: str) -> str:
    """A hostile tenant's token, signed in from ``address`` before the runs."""
    verifier, challenge = pkce_pair()
    headers = forwarded(address)
    page = read_page(await http.get(client.authorize_url(challenge), headers=headers))
    answer = await http.post(
        f"{client.base_url}/authorize",
        data={"tx": page.tx, "csrf": page.csrf},
        headers={"cookie": f"{page.cookie_name}={page.cookie}", **headers},
    )
    code = query_of(answer.headers["location"])["code"]
    tokens = await client.exchange(http, code, verifier)
    return str(tokens.json()["access_token"])


async def main() -> None:
    if os.geteuid() != 0:
        sys.exit("run as root: the bench adds an address to lo and serves on its port 443")
    with tempfile.TemporaryDirectory() as tmp, address_on_loopback(DOCUMENT_ADDRESS):
        (Path(tmp) / "outside").mkdir()
        ca = make_ca(Path(tmp) / "ca", dns_names=[], ip_addresses=[DOCUMENT_ADDRESS])
        with (
            outside_world(Path(tmp) / "outside") as world,
            documents_served(ca.server_context()) as docs,
        ):
            env = {**world.server_env(), "SSL_CERT_FILE": str(ca.ca_pem)}
            await measure(Path(tmp), env, docs)


@contextlib.contextmanager
def documents_served(context: ssl.SSLContext) -> Iterator[DocumentServer]:
    """The document server on DOCUMENT_ADDRESS:443 (the server fetches documents from
    the standard https port only), on an event loop of its own in a thread: the bench's
    loop, busy with every attacker, must not be what delays a document's answer."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="documents", daemon=True)
    thread.start()
    documents = DocumentServer(context, host=DOCUMENT_ADDRESS, port=443)
    try:
        asyncio.run_coroutine_threadsafe(documents.__aenter__(), loop).result(30)
        try:
            yield documents
        finally:
            asyncio.run_coroutine_threadsafe(documents.__aexit__(None, None, None), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


@contextlib.contextmanager
def address_on_loopback(address: str) -> Iterator[None]:
    """``address`` on lo for the bench, removed afterwards (if the bench added it)."""
    cidr = f"{address}/32"
    shown = subprocess.run(
        ["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True
    )
    added = cidr not in shown.stdout
    if added:
        subprocess.run(["ip", "addr", "add", cidr, "dev", "lo"], check=True)
    try:
        yield
    finally:
        if added:
            subprocess.run(["ip", "addr", "del", cidr, "dev", "lo"], check=False)


async def measure(tmp: Path, env: dict[str, str], documents: DocumentServer) -> None:
    attackers = [*ATTACKERS, fill_disk(tmp / "state")]
    # The production sign-in budgets, per address and shared by networks; the production
    # document fetch budget (CLIENT_DOCUMENT_FETCHES_PER_MINUTE's default).
    server = start_server(
        tmp / "state",
        **{**env, "SANDBOX_MCP_EGRESS_ALLOWLIST": "pypi.org,files.pythonhosted.org"},
        SANDBOX_MCP_EGRESS_PROXY_DESCRIPTORS=str(EGRESS_DESCRIPTORS),
        SANDBOX_MCP_EGRESS_SANDBOX_BYTES_PER_DAY=str(DAY_BYTES),
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_SLOT_BACKEND="dir",
        SANDBOX_MCP_DIR_SLOT_BUDGET_MB=str(DISK_BUDGET_MB),
        SANDBOX_MCP_DISK_CHECK_INTERVAL_S=str(DISK_CHECK_INTERVAL_S),
        # A slot per sandbox: the attackers', and the honest tenants' of both runs
        # (each sign-in is a sandbox of its own).
        SANDBOX_MCP_POOL_SIZE=str(len(attackers) + 2 * HONEST + 4),
        SANDBOX_MCP_TRUSTED_PROXIES="127.0.0.1",
        SANDBOX_MCP_LOG_LEVEL="warning",
        SANDBOX_MCP_NETWORK_SHARE_PERCENT=DEFAULT_SHARES["SANDBOX_MCP_NETWORK_SHARE_PERCENT"],
        SANDBOX_MCP_ADDRESS_SHARE_PERCENT=DEFAULT_SHARES["SANDBOX_MCP_ADDRESS_SHARE_PERCENT"],
    )
    network = restricted_network_run_by(server)
    try:
        async with httpx2.AsyncClient(timeout=60) as http:
            fallback = await ManualClient.register(http, server.base_url)
            hostile = [
                (attack, await sign_in_from(http, fallback, f"203.0.113.{n + 1}"))
                for n, attack in enumerate(attackers)
            ]
        alone = await run(server, fallback, documents, [])
        attacked = await run(server, fallback, documents, hostile)
        oauth_table(alone, attacked)
        ratios(alone, attacked)
        print(f"\nmetadata documents the server fetched: {len(documents.seen)}")
    finally:
        stop_server(server)
        print(f"server warnings and errors by event: {dict(warnings_of(server)) or 0}")
        removed = remove_containers_of(tmp / "state")
        print(f"containers the stopped server kept (for a restart), removed: {removed}")
        if network is not None:
            remove_restricted_network(network)


def warnings_of(server: RunningServer) -> Counter[str]:
    """The server's log lines at warning or above, by event (a kill that failed, a
    check that failed, a budget exceeded: what the attacks made the server say)."""
    events: Counter[str] = Counter()
    for line in server.log().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("level") in ("warning", "error", "critical"):
            why = record.get("exit_code", record.get("error"))  # a failed kill's, say
            events[str(record.get("event")) + (f" ({why})" if why is not None else "")] += 1
    return events


def remove_containers_of(state: Path) -> int:
    """The containers of the deployment on ``state``: a stopped server keeps its live
    experiments' containers to take them up again at its next start, and the bench
    starts none; the managed label's value is the state dir's deployment id."""
    try:
        deployment = (state / "deployment-id").read_text().strip()
    except OSError:
        return 0
    engine = docker.from_env()
    try:
        kept = engine.containers.list(
            all=True, filters={"label": f"io.sandbox-mcp.managed={deployment}"}
        )
        for container in kept:
            container.remove(force=True)
        return len(kept)
    finally:
        engine.close()


def restricted_network_run_by(server: RunningServer) -> str | None:
    """The restricted network of the server whose process runs its Squid (its log, at
    level warning, does not name it): the egress folder whose owner is that process."""
    for owner in Path("/run/sandbox-mcp").glob("egress-*/owner.json"):
        try:
            pid = json.loads(owner.read_text()).get("pid")
        except (OSError, ValueError):
            continue
        if pid == server.process.pid:
            return "sandbox-mcp-restricted-" + owner.parent.name.removeprefix("egress-")
    return None


if __name__ == "__main__":
    asyncio.run(main())
