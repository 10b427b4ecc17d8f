"""Fetch a small document from a URL someone else chose, without becoming an SSRF proxy.

A client's metadata document lives at a URL the client picks, so the server
must never be tricked into reading its own cloud metadata endpoint, a service on
loopback, or anything on the private network (MCP security best practices,
"SSRF Against Authorization Servers"). The rules, in order:

* the host is resolved once, and every address it resolves to must be public;
* the connection goes to that checked address (pinned), never to a second
  resolution, so DNS rebinding cannot swap in a private address afterwards;
  TLS still verifies the certificate against the URL's host name;
* https only, no redirects followed, at most ``max_bytes`` read and
  ``timeout_s`` spent in total.

The HTTP itself is httpcore2's (the transport under the MCP SDK's httpx2); we
only supply the network backend that pins the address.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import ssl
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpcore2
import structlog

from auth.lookup_shares import HeldShare
from jail.addresses import AddressPolicy, Resolver, is_public_address

log = structlog.get_logger(__name__)

# getaddrinfo blocks a thread; a nameserver that never answers must not tie up the
# default executor the jail and the runtime use. The client picks the host, and so may
# pick its nameserver: each sign-in address and network may hold only its share of
# these (auth.client_documents), so filling them all takes as many networks as
# spending any global budget does (ten by default: 2 of 20 each).
LOOKUP_THREADS = 20
_DNS_THREADS = ThreadPoolExecutor(max_workers=LOOKUP_THREADS, thread_name_prefix="cimd-dns")


class FetchRefused(Exception):
    """The document was not fetched, or not accepted; ``reason`` is one plain sentence.

    ``transient`` marks failures that say nothing about the document (timeouts,
    connection failures, 5xx), after which a cached copy may still be served.
    """

    def __init__(self, reason: str, *, transient: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.transient = transient


@dataclass(frozen=True)
class Fetched:
    body: bytes
    cache_control: str | None


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().run_in_executor(
        _DNS_THREADS, lambda: socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class _PinnedBackend(httpcore2.AsyncNetworkBackend):
    """Connects every request to one address chosen beforehand, whatever host the URL names."""

    def __init__(self, address: str, network: httpcore2.AsyncNetworkBackend) -> None:
        self._address = address
        self._network = network

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore2's interface
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        del host  # the URL's host goes to TLS (SNI, certificate check), not to the resolver
        return await self._network.connect_tcp(
            self._address, port, timeout, local_address, socket_options
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore2's interface
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise FetchRefused("Unix sockets are never used.")

    async def sleep(self, seconds: float) -> None:
        await self._network.sleep(seconds)


class PublicFetcher:
    """GET a small https document from a public address (see the module docstring)."""

    def __init__(
        self,
        *,
        max_bytes: int = 5 * 1024,
        timeout_s: float = 10.0,
        resolver: Resolver = system_resolver,
        allow: AddressPolicy = is_public_address,
        ssl_context: ssl.SSLContext | None = None,
        network: httpcore2.AsyncNetworkBackend | None = None,
        user_agent: str = "sandbox-mcp",
        ports: frozenset[int] | None = frozenset({443}),
    ) -> None:
        """``ports``: the ports that may be fetched from (None: any). Only 443 by
        default, so nobody can use the server to probe other ports of public hosts."""
        self.max_bytes = max_bytes
        self._ports = ports
        self.timeout_s = timeout_s
        self._resolver = resolver
        self._allow = allow
        # The system trust store; SSL_CERT_FILE is honoured (OpenSSL's default paths).
        self._ssl_context = ssl_context or ssl.create_default_context()
        self._network = network or httpcore2.AnyIOBackend()
        self._user_agent = user_agent

    def precheck(self, url: str) -> tuple[str, int]:
        """The refusals that need no network (scheme, port, a host that is a loopback
        name or a non-public address literal), so that a URL that can never be fetched
        is refused before it spends any budget; returns the host and port.

        Raises:
            FetchRefused: the URL can never be fetched.
        """
        try:
            parts = urlsplit(url)
            port = parts.port or 443
        except ValueError:
            raise FetchRefused("The URL is not valid.") from None
        host = parts.hostname
        if parts.scheme != "https" or not host or not url.isascii():
            raise FetchRefused("Only https URLs written in ASCII are fetched.")
        if self._ports is not None and port not in self._ports:
            raise FetchRefused("Documents are fetched only from the standard https port, 443.")
        name = host.removesuffix(".")  # "localhost." is localhost too
        try:
            literal = ipaddress.ip_address(name)
        except ValueError:
            literal = None
        if (literal is not None and not self._allow(literal)) or (
            name == "localhost" or name.endswith(".localhost")  # RFC 6761: always loopback
        ):
            raise FetchRefused(
                f"The host {host} is a private, loopback or link-local address, "
                "which is never fetched."
            )
        refusal = None if literal is not None else _not_a_domain_name(name)
        if refusal:
            raise FetchRefused(f"The host {host} {refusal}")
        return host, port

    async def get(self, url: str, *, share: HeldShare | None = None) -> Fetched:
        """Fetch ``url``; a status other than 200 is refused. ``share``: the places the
        host's lookup runs in (held until the lookup ends), given back if none is needed.

        Raises:
            FetchRefused: a non-public address, a refused or failed connection, a
                redirect or other status, a body over the limit, or the deadline.
        """
        try:
            host, port = self.precheck(url)
            async with asyncio.timeout(self.timeout_s):
                address = await self._checked_address(host, port, share)
                return await self._download(url, address)
        except TimeoutError:
            raise FetchRefused(
                f"The server did not answer within {self.timeout_s:g} s.", transient=True
            ) from None
        finally:
            if share is not None:
                share.release()  # not looked up (an address literal, a refusal before)

    async def _checked_address(self, host: str, port: int, share: HeldShare | None) -> str:
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                lookup = self._resolver(host, port)
                answers = await (share.run(lookup) if share is not None else lookup)
            except (OSError, UnicodeError):  # UnicodeError: an empty or over-long label
                raise FetchRefused(f"The host {host} does not resolve.", transient=True) from None
            addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in answers]
        if not addresses:
            raise FetchRefused(f"The host {host} does not resolve.")
        # Every answer must be public: a mix is how rebinding attacks get in.
        if not all(self._allow(address) for address in addresses):
            raise FetchRefused(
                f"The host {host} resolves to a private, loopback or link-local address, "
                "which is never fetched."
            )
        return str(addresses[0])

    async def _download(self, url: str, address: str) -> Fetched:
        timeouts = {key: self.timeout_s for key in ("connect", "read", "write", "pool")}
        headers = [(b"Accept", b"application/json"), (b"User-Agent", self._user_agent.encode())]
        try:
            async with (
                httpcore2.AsyncConnectionPool(
                    ssl_context=self._ssl_context,
                    network_backend=_PinnedBackend(address, self._network),
                    max_connections=1,
                    retries=0,
                ) as pool,
                pool.stream("GET", url, headers=headers, extensions={"timeout": timeouts}) as reply,
            ):
                if 300 <= reply.status < 400:
                    raise FetchRefused(
                        f"The server answered with a redirect ({reply.status}), "
                        "and redirects are not followed."
                    )
                if reply.status != 200:
                    raise FetchRefused(
                        f"The server answered HTTP {reply.status}, not 200.",
                        transient=reply.status >= 500,
                    )
                header = dict((k.lower(), v) for k, v in reply.headers)
                declared = header.get(b"content-length", b"0")
                if declared.isdigit() and int(declared) > self.max_bytes:
                    raise FetchRefused(self._too_big())
                body = bytearray()
                async for chunk in reply.aiter_stream():
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise FetchRefused(self._too_big())
        except FetchRefused:
            raise
        except (httpcore2.ConnectError, httpcore2.ConnectTimeout, ssl.SSLError, OSError) as exc:
            # One sentence for every way a connection fails: the refusal page must not
            # tell a prober whether a port is closed, filtered or speaking something else.
            log.info("oauth.client_document_connect_failed", error=_short(exc))
            raise FetchRefused(
                "The server could not be reached over https with a valid certificate.",
                transient=True,
            ) from None
        except Exception as exc:  # a hostile server must get a refusal, never a 500
            log.info("oauth.client_document_download_failed", error=_short(exc))
            raise FetchRefused(
                f"The download failed ({type(exc).__name__}).", transient=True
            ) from None
        cache_control = header.get(b"cache-control")
        return Fetched(bytes(body), cache_control.decode("latin-1") if cache_control else None)

    def _too_big(self) -> str:
        return f"The document is larger than {self.max_bytes} bytes."


_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)")


def _not_a_domain_name(name: str) -> str | None:
    """Why ``name`` (not an IP address literal) cannot name a public host, or None.

    Checked before any budget is spent, since the resolver would read some of these
    as addresses: glibc's ``getaddrinfo`` takes ``127.1``, ``2130706433``,
    ``0x7f.1`` and ``017700000001`` for 127.0.0.1 (inet_aton's shorthand forms),
    and the WHATWG URL standard treats any host whose last label is a number the
    same way. Only the canonical dotted quad is an IPv4 literal here; every other
    name must be a domain name of LDH labels (RFC 1123) with at least one dot (a
    single label resolves through the search domains, to the local network).
    """
    labels = name.lower().split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        return (
            "is a number, not a domain name (an IPv4 address is written as four decimal "
            "numbers, such as 192.0.2.1), so it is never fetched."
        )
    if len(labels) < 2 or len(name) > 253 or not all(_LABEL.fullmatch(lab) for lab in labels):
        return "is not a public domain name, so it is never fetched."
    return None


def _short(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."
