"""The SDK client signs in with a Client ID Metadata Document instead of registering.

The server fetches documents from public addresses only, so the document is
served from a public address added to this machine's loopback interface for
the test (192.88.99.1, the retired 6to4 relay anycast prefix; RFC 7526),
with a throwaway CA the server trusts through SSL_CERT_FILE. Nothing in the
server is relaxed for the test: the production address policy, pinning and TLS
checks all run. Needs root and iproute2 (CI runs as root; .ci/run installs it).
The slow-nameserver test also starts its server in a mount namespace of its own
(util-linux's unshare and mount), with a resolv.conf of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from e2e_server import DEFAULT_SHARES, RunningServer, start_server, stop_server
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from oauth_browser import pkce_pair
from sdk_signin import sdk_signin
from tls_testkit import Answer, DocumentServer, ThrowawayCA, make_ca

pytestmark = pytest.mark.e2e

PUBLIC_ADDRESS = "192.88.99.1"
REDIRECT = "http://127.0.0.1:9/callback"
DOCUMENT_PATH = "/oauth/mcp-client.json"
HONEST_HOST = "honest.example"  # PUBLIC_ADDRESS in the hosts file of test_a_network_s_slow_...
SILENT_NAMESERVER = "127.0.0.77"


@pytest.fixture(scope="module")
def public_address() -> Iterator[str]:
    """PUBLIC_ADDRESS on lo for the length of the module, removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("this test adds an address to lo: run it as root with iproute2 installed")
    cidr = f"{PUBLIC_ADDRESS}/32"
    shown = subprocess.run(
        ["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True
    )
    added = cidr not in shown.stdout
    if added:
        subprocess.run(["ip", "addr", "add", cidr, "dev", "lo"], check=True)
    yield PUBLIC_ADDRESS
    if added:
        subprocess.run(["ip", "addr", "del", cidr, "dev", "lo"], check=False)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory, public_address: str) -> ThrowawayCA:
    return make_ca(
        Path(tmp_path_factory.mktemp("ca")),
        dns_names=[HONEST_HOST],
        ip_addresses=[public_address],
    )


def server_with(tmp_path: Path, ca: ThrowawayCA, **env: str) -> RunningServer:
    return start_server(
        tmp_path / "state",
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="2",
        SSL_CERT_FILE=str(ca.ca_pem),
        **env,
    )


@pytest.fixture
def oauth_server(tmp_path: Path, ca: ThrowawayCA) -> Iterator[RunningServer]:
    running = server_with(tmp_path, ca)
    yield running
    stop_server(running)


def document_server(ca: ThrowawayCA, address: str) -> DocumentServer:
    # Port 443: the server fetches documents from the standard https port only.
    return DocumentServer(ca.server_context(), host=address, port=443)


def publish(documents: DocumentServer, host: str, document: dict[str, object]) -> str:
    """Serve ``document`` (its client_id set to its own URL unless given) at DOCUMENT_PATH."""
    url = f"https://{host}{DOCUMENT_PATH}"
    documents.answers[DOCUMENT_PATH] = Answer(
        body=json.dumps({"client_id": url, **document}).encode(),
        headers={"Cache-Control": "max-age=300"},
    )
    return url


async def sandbox_of(http: httpx2.AsyncClient, server: RunningServer) -> str:
    async with Client(streamable_http_client(server.mcp_url, http_client=http)) as client:  # type: ignore[arg-type]
        outcome = await client.call_tool("sandbox_status", {})
        assert not outcome.is_error, outcome
        assert outcome.structured_content is not None
        return str(outcome.structured_content["sandbox"])


async def test_the_sdk_client_signs_in_with_its_metadata_document(
    oauth_server: RunningServer, ca: ThrowawayCA, public_address: str
) -> None:
    async with document_server(ca, public_address) as documents:
        url = publish(
            documents,
            public_address,
            {"client_name": "Published client", "redirect_uris": [REDIRECT]},
        )
        signin = sdk_signin(
            oauth_server, client_name="cimd e2e", redirect_uri=REDIRECT, client_metadata_url=url
        )
        provider, storage, pages = signin.provider, signin.storage, signin.pages
        async with httpx2.AsyncClient(auth=provider, timeout=30) as http:
            first = await sandbox_of(http, oauth_server)
            assert storage.client_info is not None
            assert storage.client_info.client_id == url, "no registration: the URL is the client"
            assert storage.tokens is not None
            old_refresh = storage.tokens.refresh_token
            provider.context.token_expiry_time = 1  # long expired: the next call refreshes
            assert await sandbox_of(http, oauth_server) == first
            assert storage.tokens.refresh_token != old_refresh
        # A second sign-in with the same document (another install of the same client)
        # is served from the cache: the document said max-age=300.
        again = sdk_signin(
            oauth_server, client_name="cimd e2e", redirect_uri=REDIRECT, client_metadata_url=url
        )
        async with httpx2.AsyncClient(auth=again.provider, timeout=30) as http:
            assert await sandbox_of(http, oauth_server) != first, "its own sign-in, its own key"
        assert len(again.pages) == 1
        assert [s.path for s in documents.seen] == [DOCUMENT_PATH], "fetched once, then cached"
    assert len(pages) == 1
    # The name comes from the document (not the SDK's own metadata), with its source shown.
    assert "Published client" in pages[0]
    assert f"Its name comes from <strong>{public_address}</strong>" in pages[0]
    assert "this computer" in pages[0]  # the loopback redirect is called out
    log = oauth_server.log()
    assert "oauth.client_document_fetched" in log
    assert "oauth.code_exchanged" in log
    assert "oauth.client_registered" not in log


async def test_a_document_naming_another_client_id_stops_the_sign_in(
    oauth_server: RunningServer, ca: ThrowawayCA, public_address: str
) -> None:
    async with document_server(ca, public_address) as documents:
        url = publish(
            documents,
            public_address,
            {
                "client_id": "https://claude.ai/oauth/mcp-oauth-client-metadata",
                "client_name": "Impostor",
                "redirect_uris": [REDIRECT],
            },
        )
        async with httpx2.AsyncClient() as http:
            page = await http.get(
                f"{oauth_server.base_url}/authorize",
                params={
                    "client_id": url,
                    "redirect_uri": REDIRECT,
                    "response_type": "code",
                    "code_challenge": "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
                    "code_challenge_method": "S256",
                },
            )
    assert page.status_code == 400
    assert "location" not in page.headers
    assert "exactly the URL" in page.text
    assert "Impostor" not in page.text


async def test_with_documents_off_the_sdk_client_registers_instead(
    tmp_path: Path, ca: ThrowawayCA
) -> None:
    server = server_with(tmp_path, ca, SANDBOX_MCP_CLIENT_METADATA_DOCUMENTS="false")
    try:
        async with httpx2.AsyncClient() as http:
            metadata = await http.get(f"{server.base_url}/.well-known/oauth-authorization-server")
            assert metadata.json()["client_id_metadata_document_supported"] is False
            signin = sdk_signin(
                server,
                client_name="cimd e2e",
                redirect_uri=REDIRECT,
                client_metadata_url="https://client.example/meta.json",
            )
            storage = signin.storage
            http.auth = signin.provider
            http.timeout = httpx2.Timeout(30)
            await sandbox_of(http, server)
        assert storage.client_info is not None
        assert not storage.client_info.client_id.startswith("https://"), "it registered"
        assert "oauth.client_registered" in server.log()
    finally:
        stop_server(server)


def authorize_params(client_id: str) -> dict[str, str]:
    _, challenge = pkce_pair()
    return {
        "client_id": client_id,
        "redirect_uri": REDIRECT,
        "response_type": "code",
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }


async def signs_in_with_its_document(
    server: RunningServer, ca: ThrowawayCA, address: str, name: str
) -> tuple[str, list[str]]:
    """The SDK client signs in with a new document called ``name``: the sign-in page
    it saw, and the paths the document server was asked for."""
    async with document_server(ca, address) as documents:
        url = publish(documents, address, {"client_name": name, "redirect_uris": [REDIRECT]})
        signin = sdk_signin(
            server, client_name="cimd e2e", redirect_uri=REDIRECT, client_metadata_url=url
        )
        async with httpx2.AsyncClient(auth=signin.provider, timeout=30) as http:
            await sandbox_of(http, server)
    return signin.pages[0], [seen.path for seen in documents.seen]


async def test_a_flood_of_loopback_document_urls_spends_no_fetch_budget(
    tmp_path: Path, ca: ThrowawayCA, public_address: str
) -> None:
    server = server_with(tmp_path, ca, SANDBOX_MCP_CLIENT_DOCUMENT_FETCHES_PER_MINUTE="1")
    try:
        async with httpx2.AsyncClient() as http:
            for number in range(20):
                for host in ("127.0.0.1", "localhost", "[::1]"):
                    page = await http.get(
                        f"{server.base_url}/authorize",
                        params=authorize_params(f"https://{host}/never-{number}.json"),
                    )
                    assert page.status_code == 400
                    assert "private, loopback or link-local" in page.text
        # The minute's one fetch is still there for a real application.
        page, _ = await signs_in_with_its_document(server, ca, public_address, "Real")
        assert "Real" in page
    finally:
        stop_server(server)


async def test_a_document_flood_does_not_lock_out_a_known_client_even_after_a_restart(
    tmp_path: Path, ca: ThrowawayCA, public_address: str
) -> None:
    # Three flooding networks (behind the trusted proxy) spend the budget of 3 fetches.
    env = {
        "SANDBOX_MCP_CLIENT_DOCUMENT_FETCHES_PER_MINUTE": "3",
        "SANDBOX_MCP_TRUSTED_PROXIES": "127.0.0.1",
        **DEFAULT_SHARES,
    }
    async with document_server(ca, public_address) as documents:
        url = publish(
            documents, public_address, {"client_name": "Known", "redirect_uris": [REDIRECT]}
        )
        server = server_with(tmp_path, ca, **env)
        try:
            first = sdk_signin(
                server, client_name="cimd e2e", redirect_uri=REDIRECT, client_metadata_url=url
            )
            async with httpx2.AsyncClient(auth=first.provider, timeout=30) as http:
                await sandbox_of(http, server)
        finally:
            stop_server(server)
        server = server_with(tmp_path, ca, **env)  # the same state dir: its memory is empty
        try:
            async with httpx2.AsyncClient() as http:

                async def sign_in_page(client_id: str, address: str) -> httpx2.Response:
                    return await http.get(
                        f"{server.base_url}/authorize",
                        params=authorize_params(client_id),
                        headers={"x-forwarded-for": address},
                    )

                # The budget is in the database (every process shares it, a restart
                # keeps it): the first run's fetch spent one of the 3, two floods (from
                # two networks: each may spend one) the rest.
                for number, network in enumerate(("198.51.100.1", "203.0.113.1")):
                    flood = f"https://{public_address}/flood-{number}.json"
                    refused = await sign_in_page(flood, network)
                    assert "HTTP 404" in refused.text, "fetched, and spent its share"
                spent = await sign_in_page(f"https://{public_address}/new.json", "192.0.2.1")
                assert "Too many new applications" in spent.text
            again = sdk_signin(
                server, client_name="cimd e2e", redirect_uri=REDIRECT, client_metadata_url=url
            )
            async with httpx2.AsyncClient(auth=again.provider, timeout=30) as http:
                await sandbox_of(http, server)
            assert "Known" in again.pages[0]
            assert "oauth.client_document_from_store" in server.log()
        finally:
            stop_server(server)
    fetched = [seen.path for seen in documents.seen]
    assert fetched.count(DOCUMENT_PATH) == 1, "the known client was not fetched again"
    assert len(fetched) == 3, "the budget of 3 held across the restart"


# Host names glibc's getaddrinfo reads as 127.0.0.1 (inet_aton's shorthands), and names
# that are no public domain name: each refused before the fetch budget is asked.
NUMERIC_HOSTS = (
    "127.10.0",
    "2130706433",
    "0x7f.1",
    "017700000001",
    "0177.0.0.1",
    "127.1",
    "0x7f000001",
    "localhost.",
    "intranet",
    "a..b",
)


async def test_numeric_host_names_are_refused_without_spending_the_fetch_budget(
    tmp_path: Path, ca: ThrowawayCA, public_address: str
) -> None:
    """Issue 23, finding 8: numeric names passed the no-network precheck and spent the
    budget before the resolver's answer was refused; two or three locked new clients out."""
    server = server_with(tmp_path, ca, SANDBOX_MCP_CLIENT_DOCUMENT_FETCHES_PER_MINUTE="1")
    try:
        async with httpx2.AsyncClient() as http:
            for number in range(100):
                host = NUMERIC_HOSTS[number % len(NUMERIC_HOSTS)]
                page = await http.get(
                    f"{server.base_url}/authorize",
                    params=authorize_params(f"https://{host}/never-{number}.json"),
                )
                assert page.status_code == 400, (host, page.text)
                assert "is never fetched" in page.text, (host, page.text)
                assert "Too many new applications" not in page.text
        page, fetched = await signs_in_with_its_document(server, ca, public_address, "Honest")
        assert "Honest" in page, "the minute's one fetch was still there"
        assert fetched == [DOCUMENT_PATH]
    finally:
        stop_server(server)


def log_events(server: RunningServer, event: str) -> list[dict[str, object]]:
    """The server's log lines of ``event`` (JSON lines on stderr)."""
    lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == event]


def assert_bounded(server: RunningServer, event: str, refused: int, minutes: int) -> None:
    """``event``'s lines: at most 30 a minute written, and with the counts of the rest
    exactly ``refused``."""
    lines = log_events(server, event)
    written = [line for line in lines if "repeats_not_written" not in line]
    counted = [line for line in lines if "repeats_not_written" in line]
    assert 0 < len(written) <= 30 * minutes, (event, len(written))
    assert counted, f"{event}: the repeats are told in a line of their own"
    told = len(written) + sum(int(str(line["repeats_not_written"])) for line in counted)
    assert told == refused, (event, told, refused)


async def test_a_flood_of_refused_document_urls_writes_a_bounded_log(
    tmp_path: Path, ca: ThrowawayCA, public_address: str
) -> None:
    """Issue 23: 8 networks flooding /authorize with numeric-host client_ids wrote one
    ``oauth.client_document_refused`` warning per request (26,288 in 170 s) into the
    log every tenant shares; /register past its budget the same. Now each minute
    writes at most 30 of each event (5 an address, 10 a network), and the rest are
    counted in one line as the minute ends or at shutdown: every refusal is in a line
    or a count, whatever the machine's speed."""
    server = server_with(tmp_path, ca, SANDBOX_MCP_TRUSTED_PROXIES="127.0.0.1", **DEFAULT_SHARES)
    flood = 600
    registrations_refused = 0
    started = time.monotonic()
    try:
        async with httpx2.AsyncClient() as http:
            for number in range(flood):
                host = NUMERIC_HOSTS[number % len(NUMERIC_HOSTS)]
                page = await http.get(
                    f"{server.base_url}/authorize",
                    params=authorize_params(f"https://{host}/never-{number}.json"),
                    # 8 networks of 3 addresses each, behind the trusted proxy.
                    headers={"x-forwarded-for": f"198.51.{number % 8}.{number % 24}"},
                )
                assert page.status_code == 400, (host, page.text)
            for number in range(200):  # past their shares of the 30 registrations a minute
                registered = await http.post(
                    f"{server.base_url}/register",
                    json={"redirect_uris": [REDIRECT], "client_name": f"flood {number}"},
                    headers={"x-forwarded-for": f"198.51.{number % 8}.{number % 24}"},
                )
                assert registered.status_code in (201, 429), registered.text
                registrations_refused += registered.status_code == 429
        page, _ = await signs_in_with_its_document(server, ca, public_address, "Honest")
        assert "Honest" in page, "an honest sign-in still works"
    finally:
        stop_server(server)  # the count of the minute not over is written at shutdown
    minutes = int((time.monotonic() - started) // 60) + 2  # every minute the flood may span
    assert registrations_refused >= 170, "at most 3 a network were accepted"
    assert_bounded(server, "oauth.client_document_refused", flood, minutes)
    assert_bounded(server, "oauth.register_rate_limited", registrations_refused, minutes)


async def test_many_networks_cannot_spend_every_document_fetch(
    tmp_path: Path, ca: ThrowawayCA, public_address: str
) -> None:
    """Of 20 fetches a minute, one /64 may spend 5% (1) and one /48 10% (2): nine
    flooding networks (27 /64s, 54 invented URLs) leave two fetches to everyone else."""
    server = server_with(
        tmp_path,
        ca,
        SANDBOX_MCP_CLIENT_DOCUMENT_FETCHES_PER_MINUTE="20",
        SANDBOX_MCP_TRUSTED_PROXIES="127.0.0.1",
        **DEFAULT_SHARES,
    )
    try:
        async with document_server(ca, public_address) as documents, httpx2.AsyncClient() as http:

            async def sign_in_page(client_id: str, address: str) -> httpx2.Response:
                return await http.get(
                    f"{server.base_url}/authorize",
                    params=authorize_params(client_id),
                    headers={"x-forwarded-for": address},
                )

            answers = []
            for number in range(54):
                address = f"2001:db8:{number % 9:x}:{number % 27:x}::1"
                flood = f"https://{public_address}/flood-{number}.json"
                answers.append((await sign_in_page(flood, address)).text)
            assert sum("HTTP 404" in text for text in answers) == 18, "fetched: 2 a network"
            assert sum("Too many new applications" in text for text in answers) == 36
            url = publish(
                documents, public_address, {"client_name": "Fresh", "redirect_uris": [REDIRECT]}
            )
            fresh = await sign_in_page(url, "198.51.100.7")
            assert fresh.status_code == 200, fresh.text
            assert "Fresh" in fresh.text, "a new network's document is still fetched"
            assert len(documents.seen) == 19
    finally:
        stop_server(server)


class SilentNameserver:
    """A nameserver on SILENT_NAMESERVER:53 that never answers; ``asked``: the names it
    was asked for (each lookup's A and AAAA queries name one)."""

    def __init__(self) -> None:
        self.asked: set[str] = set()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind((SILENT_NAMESERVER, 53))
        self._socket.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                query = self._socket.recv(4096)
            except TimeoutError:
                continue
            labels, at = [], 12  # the question's name follows the 12-byte header
            while at < len(query) and query[at]:
                labels.append(query[at + 1 : at + 1 + query[at]].decode("ascii", "replace"))
                at += 1 + query[at]
            self.asked.add(".".join(labels))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close()


def private_resolver(tmp_path: Path) -> list[str]:
    """A wrapper that starts the server in a mount namespace of its own whose
    /etc/resolv.conf names only the silent nameserver (one 30 s try: glibc's longest)
    and whose /etc/hosts names HONEST_HOST: the machine's own files are untouched."""
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver {SILENT_NAMESERVER}\noptions timeout:30 attempts:1\n")
    hosts = tmp_path / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text() + f"\n{PUBLIC_ADDRESS} {HONEST_HOST}\n")
    script = (
        f'mount --bind {resolv} /etc/resolv.conf && mount --bind {hosts} /etc/hosts && exec "$@"'
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


async def test_a_network_s_slow_nameserver_leaves_another_network_s_sign_in_served(
    tmp_path: Path, ca: ThrowawayCA, public_address: str
) -> None:
    """Issue 23, finding 8's class: ten /64s of one /48 sign in with 30 hosts whose
    nameserver never answers, within their fetch shares. The lookups held every one of
    the fetcher's threads past the fetch's 10 s, and a new client's sign-in from another
    network timed out behind them. Now the network holds its share (2 lookups), the rest
    of its sign-ins are told to try again, spending nothing, and the other is served."""
    nameserver = SilentNameserver()
    server = start_server(
        tmp_path / "state",
        wrapper=private_resolver(tmp_path),
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="2",
        SSL_CERT_FILE=str(ca.ca_pem),
        SANDBOX_MCP_CLIENT_DOCUMENT_FETCHES_PER_MINUTE="1000",  # the fetch budget: no limit here
        SANDBOX_MCP_TRUSTED_PROXIES="127.0.0.1",
        **DEFAULT_SHARES,
    )
    flood: list[asyncio.Task[httpx2.Response]] = []
    try:
        async with (
            document_server(ca, public_address) as documents,
            httpx2.AsyncClient(timeout=120) as http,
        ):

            async def sign_in_page(client_id: str, address: str) -> httpx2.Response:
                return await http.get(
                    f"{server.base_url}/authorize",
                    params=authorize_params(client_id),
                    headers={"x-forwarded-for": address},
                )

            flood = [
                asyncio.create_task(
                    sign_in_page(f"https://h{n}.slow.example/m.json", f"2001:db8:bad:{n % 10}::1")
                )
                for n in range(30)
            ]
            pending = set(flood)
            async with asyncio.timeout(60):  # generous: each waits 5 s for its place
                while len(flood) - len(pending) < 28:
                    _, pending = await asyncio.wait(pending, return_when="FIRST_COMPLETED")
            told = [task.result() for task in flood if task.done()]
            for page in told:
                assert page.status_code == 400, page.text
                assert "are still waiting for their applications" in page.text, page.text
            assert len(nameserver.asked) == 2, nameserver.asked  # the network's share only
            url = publish(
                documents, HONEST_HOST, {"client_name": "Fresh", "redirect_uris": [REDIRECT]}
            )
            fresh = await asyncio.wait_for(sign_in_page(url, "198.51.100.7"), 60)
            assert fresh.status_code == 200, fresh.text
            assert "Fresh" in fresh.text, "another network's document is fetched at once"
            assert HONEST_HOST not in nameserver.asked
    finally:
        for task in flood:
            task.cancel()  # the two still looking up would wait out the fetch's 10 s
        await asyncio.gather(*flood, return_exceptions=True)
        # Killed: an interpreter exits only once its lookup threads have, 30 s here.
        server.process.kill()
        stop_server(server)
        nameserver.close()
