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
   manager in every form.

The outside world is ``egress_testkit``'s registry (a network namespace, built images
trusting its CA); Squid is asked for EGRESS_DESCRIPTORS, so that the hoarders' bound
(a slot's share) is smaller than the per-container limit and is what holds them.

Meanwhile /health is timed, and each honest sign-in's OAuth requests (discovery,
/register, /token). For each run: the honest calls' p50, p95 and p99, their errors,
the honest sign-ins refused, the attackers' calls refused and accepted (by attack),
and the ratios attacked/alone.

An honest registration refused is counted and the tenant signs in with a client
registered before the runs; a sign-in refused is counted and leaves the tenant
without a token (it runs no session). Honest errors are printed by tool and code.

Bounded for 2 shared cores: 10 honest and 6 general hostile tenants (not 20 and
20), 2 sessions each; the attackers stop when the honest tenants are done (about
2 minutes in all on a busy machine).

    uv run python tests/bench/bench_fairness.py
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx2

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))
sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))

from e2e_server import DEFAULT_SHARES, RunningServer, start_server, stop_server
from egress_testkit import (
    BIG_FILE,
    FETCH,
    hold,
    outside_world,
    remove_restricted_network,
)
from mcp_http import read_when_written, rpc_request, run_command, tool
from oauth_browser import REDIRECT_URI, ManualClient, pkce_pair, query_of, read_page
from test_executor_stream_flood_over_http import FLOOD
from test_hostile_reports_over_http import HOSTILE as DEEP_REPORTS
from test_hostile_reports_over_http import NAMESPACED
from test_restricted_egress_shared_proxy_over_http import ASK, FORMS, INDEX

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

REDOS = "(a+)+$"
GLOB_BOMB = "*a*a*a*a*a*a*a*a*a*a*b"
# The stream test's flood (its mode "unknown-id": lines of an id nobody asked for), and
# a variant of its no-newline mode writing one byte at a time (mode "one-byte").
STREAM_FLOODS = {"unknown-id": FLOOD, "one-byte": FLOOD.replace('b"x" * 65536', 'b"x"')}
REPORTS = {"deep": DEEP_REPORTS["MAX_DEPTH"], "namespaced": NAMESPACED}

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
) -> str | None:
    """A new user's sign-in from its own address, as claude.ai does it: discovery, its
    own registration (on refusal: the fallback client, the refusal counted), the
    sign-in page and its button, the code redeemed. The access token, or None."""
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
    return str(tokens.json()["access_token"])


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


async def run(server: RunningServer, fallback: ManualClient, hostile: list[str] | None) -> Measured:
    m = Measured()
    stop = asyncio.Event()
    limits = httpx2.Limits(max_connections=300)
    async with httpx2.AsyncClient(timeout=120, limits=limits) as http:
        background = [asyncio.create_task(health(http, server, stop, m))]
        if hostile:
            background += [
                asyncio.create_task(attack(http, server, token, stop, m.attacks))
                for attack, token in zip(ATTACKERS, hostile, strict=True)
            ]
            background.append(
                asyncio.create_task(signin_flood(http, server, fallback, stop, m.attacks))
            )
            await asyncio.sleep(5)  # let the attacks start first
        started = time.perf_counter()

        async def tenant(n: int) -> None:
            token = await honest_sign_in(http, server, n, fallback, m)
            if token is None:
                m.signins_refused += 1
                return
            for _ in range(ROUNDS):
                await honest_session(http, server, token, m)

        await asyncio.gather(*(tenant(n) for n in range(HONEST)))
        elapsed = time.perf_counter() - started
        stop.set()
        for outcome in await asyncio.gather(*background, return_exceptions=True):
            if isinstance(outcome, BaseException):
                m.attacks["attacker crashed"][type(outcome).__name__] += 1
    label = f"beside {len(ATTACKERS)} attackers + sign-in flood" if hostile else "alone (floor)"
    print(f"\n{label}: {len(m.calls)} honest calls in {elapsed:.1f} s")
    print(
        f"  honest calls: p50 {ms(m.calls, 0.5)} ms, p95 {ms(m.calls, 0.95)} ms, "
        f"p99 {ms(m.calls, 0.99)} ms; errors {m.errors}; "
        f"honest tenants refused a sign-in {m.signins_refused} of {HONEST}; "
        f"honest OAuth steps refused: {dict(m.refusals) or 0}"
    )
    if m.error_codes:
        print(f"  honest errors: {dict(m.error_codes)}")
    for name, values in m.by_tool.items():
        print(f"    {name:<20} p50 {ms(values, 0.5):>6} ms, p99 {ms(values, 0.99):>6} ms")
    for name, values in (("/health", m.health), *m.oauth.items()):
        print(
            f"  {name:<10} n {len(values):4d}: p50 {ms(values, 0.5)} ms, "
            f"p99 {ms(values, 0.99)} ms, max {max(values, default=0) * 1000:.0f} ms"
        )
    for kind, counts in sorted(m.attacks.items()):
        print(f"  attackers, {kind}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return m


def ratios(alone: Measured, attacked: Measured) -> None:
    print("\nattacked/alone:")
    rows = [
        ("honest calls", alone.calls, attacked.calls),
        ("/health", alone.health, attacked.health),
    ]
    rows += [(kind, alone.oauth[kind], attacked.oauth[kind]) for kind in alone.oauth]
    for name, before, after in rows:
        print(
            f"  {name:<13} p50 {percentile(after, 0.5) / percentile(before, 0.5):6.2f}, "
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
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "outside").mkdir()
        with outside_world(Path(tmp) / "outside") as world:
            await measure(Path(tmp), world.server_env())


async def measure(tmp: Path, egress: dict[str, str]) -> None:
    # The production sign-in budgets, per address and shared by networks.
    server = start_server(
        tmp / "state",
        **{**egress, "SANDBOX_MCP_EGRESS_ALLOWLIST": "pypi.org,files.pythonhosted.org"},
        SANDBOX_MCP_EGRESS_PROXY_DESCRIPTORS=str(EGRESS_DESCRIPTORS),
        SANDBOX_MCP_EGRESS_SANDBOX_BYTES_PER_DAY=str(DAY_BYTES),
        SANDBOX_MCP_AUTH="oauth",
        # A slot per sandbox: the attackers', and the honest tenants' of both runs
        # (each sign-in is a sandbox of its own).
        SANDBOX_MCP_POOL_SIZE=str(len(ATTACKERS) + 2 * HONEST + 4),
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
                await sign_in_from(http, fallback, f"203.0.113.{n + 1}")
                for n in range(len(ATTACKERS))
            ]
        alone = await run(server, fallback, None)
        attacked = await run(server, fallback, hostile)
        ratios(alone, attacked)
    finally:
        stop_server(server)
        if network is not None:
            remove_restricted_network(network)


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
