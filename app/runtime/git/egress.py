"""Where a remote clone may connect, and what its failure may say.

The clone helper is the one container with a network, and the tenant picks
its URL: unchecked, ``https://169.254.169.254/``, ``https://10.0.0.5/`` or an
internal name would reach the host's metadata service and private network,
and git's error lines (``Connection refused``, ``timed out``, certificate
details) would make it a port prober. So, as for client metadata documents
(:mod:`auth.safe_fetch`, whose address policy this reuses):

* the URL's host is resolved here, once, and every address must be public
  (no loopback, private, link-local, shared, reserved or IPv4-embedding IPv6
  address); a literal address is checked the same way, and a host that does
  not resolve is refused in the same words, so the answer never says which
  internal names exist;
* only port 443, so public hosts cannot be port-scanned either;
* git is pinned to the checked address (``http.curloptResolve``, git >= 2.37),
  so the helper's own DNS lookup can never swap in another one (rebinding),
  and follows no redirect (a redirect would be resolved afresh);
* the tenant learns what went wrong only as one of a few fixed sentences,
  never git's own lines.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final
from urllib.parse import urlsplit

import docker
import docker.errors

from app.runtime.errors import GitSourceRefused
from auth.lookup_shares import KeyedShares
from jail.addresses import AddressPolicy, IPAddress, Resolver, is_public_address

GIT_NETWORK: Final = "sandbox-mcp-git"
HTTPS_PORT: Final = 443
RESOLVE_TIMEOUT_S: Final = 10.0
_NOT_PUBLIC: Final = "its host does not resolve to a public address"
# getaddrinfo blocks its thread for as long as the tenant's nameserver makes it (the
# timeout above stops the waiting, not the lookup). A clone's lookups run on threads
# of their own: a tenant's slow names never hold the four that sign-ins' metadata
# documents are looked up on (auth.safe_fetch), nor the default executor.
_DNS_THREADS: Final = ThreadPoolExecutor(max_workers=4, thread_name_prefix="git-dns")


async def clone_resolver(host: str, port: int) -> list[str]:
    """``host``'s addresses, looked up on the clones' own threads."""
    lookup = functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    infos = await asyncio.get_running_loop().run_in_executor(_DNS_THREADS, lookup)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# Each sandbox's and each sign-in address's share of those four threads: one address's
# clones never hold them all while other tenants' clones wait and are refused.
LOOKUPS_PER_SANDBOX: Final = 1
LOOKUPS_PER_ADDRESS: Final = 2


class LookupShares(KeyedShares):
    """Lookups in flight per sandbox and per sign-in address, one instance per backend
    (one per process, as the threads are; the gates are ``auth.lookup_shares``').

    A lookup past its share waits its turn, inside ``pin_remote``'s timeout (past it, the
    clone is refused in the usual words). Its share is held until the lookup itself ends,
    not until the clone stops waiting: a timed-out ``getaddrinfo`` still holds its thread.
    """

    def __init__(
        self, per_sandbox: int = LOOKUPS_PER_SANDBOX, per_address: int = LOOKUPS_PER_ADDRESS
    ) -> None:
        super().__init__()
        self.per_sandbox = per_sandbox
        self.per_address = per_address

    def bounded(self, resolve: Resolver, sandbox: str, address: str) -> Resolver:
        """``resolve`` within ``sandbox``'s and ``address``'s shares ("": not known)."""
        keys = [(f"sandbox:{sandbox}", self.per_sandbox)] if sandbox else []
        keys += [(f"address:{address}", self.per_address)] if address else []

        async def within_share(host: str, port: int) -> list[str]:
            held = await self.take(keys)  # always sandbox, then address: no lock cycle
            return await held.run(resolve(host, port))

        return within_share


async def pin_remote(
    url: str,
    *,
    resolve: Resolver = clone_resolver,
    allow: AddressPolicy = is_public_address,
) -> str:
    """The ``http.curloptResolve`` entry (``host:443:address``) a clone of ``url`` must use.

    ``url`` has passed :func:`app.runtime.git.sources.check_url`.

    Raises:
        GitSourceRefused: another port, or a host that is not (only) public.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if (parts.port or HTTPS_PORT) != HTTPS_PORT:
        raise GitSourceRefused("url", "only the standard https port, 443, is used")
    addresses = await _addresses(host, resolve)
    # Every answer must be public: a mix is how rebinding attacks get in.
    if not addresses or not all(allow(a) for a in addresses):
        raise GitSourceRefused("url", _NOT_PUBLIC)
    # IPv4 first: Docker's bridge networks often have no IPv6 route.
    address = sorted(addresses, key=lambda a: a.version)[0]
    shown = f"[{address}]" if address.version == 6 else str(address)
    return f"{host}:{HTTPS_PORT}:{shown}"


async def _addresses(host: str, resolve: Resolver) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        async with asyncio.timeout(RESOLVE_TIMEOUT_S):
            answers = await resolve(host, HTTPS_PORT)
    except (OSError, UnicodeError, TimeoutError):
        raise GitSourceRefused("url", _NOT_PUBLIC) from None
    return [ipaddress.ip_address(a.split("%", 1)[0]) for a in answers]


def ensure_network(api: docker.APIClient, name: str, labels: dict[str, str]) -> None:
    """Create the clone helpers' bridge network unless it exists (blocking).

    A network of their own, not the default bridge: a helper never shares a
    segment with experiment containers that have egress, and with inter-container
    traffic off two helpers cannot reach each other either.
    """
    if _exists(api, name):
        return
    try:
        api.create_network(
            name,
            driver="bridge",
            options={"com.docker.network.bridge.enable_icc": "false"},
            labels=labels,
            check_duplicate=True,
        )
    except docker.errors.APIError as exc:
        # Another worker (or test) created it meanwhile.
        if exc.status_code != 409 and not _exists(api, name):
            raise


def _exists(api: docker.APIClient, name: str) -> bool:
    found: list[dict[str, Any]] = api.networks(names=[name])
    return any(n.get("Name") == name for n in found)


# (a piece of git's or curl's message, what the tenant is told); first match wins.
_KNOWN: Final = (
    ("not a branch or a tag there", None),  # our own note: skip it, look further
    ("remote branch", "the ref was not found in the repository"),
    ("could not read username", "the repository needs credentials, which are never sent"),
    ("authentication failed", "the repository needs credentials, which are never sent"),
    ("terminal prompts disabled", "the repository needs credentials, which are never sent"),
    ("repository not found", "the repository was not found (or it is private)"),
    ("not found", "the repository or the ref was not found"),
    ("couldn't find remote ref", "the ref was not found in the repository"),
    ("reference is not a tree", "the ref was not found in the repository"),
    ("did not match any file", "the ref was not found in the repository"),
    ("pathspec", "the ref was not found in the repository"),
    ("connect tunnel failed", "the egress proxy refused the connection (see below)"),
    ("proxy connect aborted", "the egress proxy refused the connection (see below)"),
    ("redirect", "the server redirected the request, and redirects are not followed"),
    ("certificate", "the server's TLS certificate was not accepted"),
    ("ssl", "the TLS connection to the server failed"),
    ("fsck", "the repository holds objects that were refused (fsck)"),
    ("the requested url returned error: 4", "the server refused the request (HTTP 4xx)"),
    ("the requested url returned error: 5", "the server failed the request (HTTP 5xx)"),
)
_UNREACHABLE: Final = "the server could not be reached over https, or the clone failed"
# git's failure is its last lines. The rest is the remote's to fill (``remote:`` lines,
# up to the 1 MB output cap): matched line by line on the event loop, 1 MB of short
# lines took 1.2-1.8 s there.
MAX_SCANNED_CHARS: Final = 16 * 1024


def tenant_error(stderr: str) -> str:
    """One fixed sentence for a failed remote clone; never git's own words. Only the last
    ``MAX_SCANNED_CHARS`` are read."""
    text = stderr[-MAX_SCANNED_CHARS:].lower()
    for line in text.splitlines():
        for piece, sentence in _KNOWN:
            if piece in line:
                if sentence is None:
                    break
                return sentence
    return _UNREACHABLE
