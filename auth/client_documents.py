"""Client ID Metadata Documents: a client whose ``client_id`` is the https URL of its metadata.

Claude and other MCP clients skip registration when the server advertises
``client_id_metadata_document_supported``: they send a URL as ``client_id``,
and the server fetches the JSON document there (draft-ietf-oauth-client-id-
metadata-document; MCP authorization, "Client ID Metadata Documents"). The
document must name itself (``client_id`` equal to its URL), carry a
``client_name`` and ``redirect_uris`` that pass the same policy as registration,
and hold no secret: such clients are public.

Fetching goes through ``PublicFetcher`` (public addresses only, pinned, 5 KB,
10 s, no redirects, port 443). Documents are cached as their ``Cache-Control``
says (at most a day); failures are remembered briefly, concurrent requests for
one URL share a fetch, and new fetches have a global budget (of which one
network and one address prefix may spend only their ``Shares``), so a flood of
invented URLs costs the world outside at most that budget. The host lookups run
on ``LOOKUP_THREADS`` threads of which one network and one address prefix may
hold only the same shares, until each lookup ends: hosts whose nameserver never
answers fill only their own network's share. URLs that can never
be fetched (a loopback name, a private address literal, a number the resolver
would read as an address, a name that is no domain name) are refused before
they spend anything. A flood cannot
lock out a client that signed in before: its document, kept a day past
freshness, is served while the budget is spent or its host is unreachable, and
after a restart ``ClientDirectory`` serves it from its stored row.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import structlog

from auth.client_address import network_key
from auth.errors import OAuthError
from auth.log_sampling import refusals
from auth.lookup_shares import HeldShare, KeyedShares
from auth.pending import ExpiringMap
from auth.ratelimit import DEFAULT_SHARES, Budget, PrefixedBudget, Shares
from auth.registration import check_client_metadata
from auth.safe_fetch import LOOKUP_THREADS, FetchRefused, PublicFetcher
from auth.store import Client

log = structlog.get_logger(__name__)

MAX_URL_LENGTH = 512  # the width of oauth_clients.client_id
# How long a new fetch waits for its address's and network's share of the lookup
# threads before it is refused. An honest lookup takes milliseconds, so only a host
# whose nameserver is slow keeps a share this long; the waiting costs the waiter alone.
LOOKUP_WAIT_S = 5.0
_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*\"?(\d+)", re.IGNORECASE)


class DocumentRefused(Exception):
    """The URL or its document cannot identify a client; ``reason`` says why, in one sentence.

    ``transient``: the failure says nothing about the document (see FetchRefused).
    """

    def __init__(self, reason: str, *, transient: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.transient = transient


def is_url_client_id(client_id: str) -> bool:
    """Registered client IDs are URL-safe base64, which never holds a colon."""
    return ":" in client_id


def check_client_id_url(url: str) -> None:
    """The URL rules of the draft, section 3: checked before anything is fetched.

    Raises:
        DocumentRefused: not https, no path, a dot segment, a fragment, user
            information, or too long.
    """
    if (
        len(url) > MAX_URL_LENGTH
        or not url.isascii()
        or any(ord(c) < 0x21 or ord(c) == 0x7F for c in url)
    ):
        raise DocumentRefused(
            f"A client ID URL must be at most {MAX_URL_LENGTH} ASCII characters with no spaces."
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise DocumentRefused("The client ID is not a valid URL.") from None
    if parts.scheme != "https" or not parts.hostname:
        raise DocumentRefused("A client ID URL must use https and name a host.")
    if parts.path in ("", "/"):
        raise DocumentRefused("A client ID URL must have a path, not just a host.")
    if any(segment in (".", "..") for segment in parts.path.split("/")) or (
        "%2e" in parts.path.lower()
    ):
        raise DocumentRefused("A client ID URL must not hold . or .. path segments.")
    if ";" in parts.path:
        # HTTP libraries drop ;params when they send the path: what would be fetched
        # would not be the URL that names the client.
        raise DocumentRefused("A client ID URL must not hold ; in its path.")
    if parts.fragment or "#" in url:
        raise DocumentRefused("A client ID URL must not have a fragment.")
    if parts.username is not None or parts.password is not None:
        raise DocumentRefused("A client ID URL must not carry user information.")


def cache_lifetime(cache_control: str | None, *, default_s: float, max_s: float) -> float:
    """Seconds to keep a document: ``no-store``/``no-cache`` mean none, ``max-age`` is
    honoured up to ``max_s``, and without either the document is kept ``default_s``."""
    if cache_control is None:
        return default_s
    lowered = cache_control.lower()
    if "no-store" in lowered or "no-cache" in lowered:
        return 0.0
    match = _MAX_AGE.search(lowered)
    if match is None:
        return default_s
    return min(float(match.group(1)), max_s)


def parse_document(url: str, body: bytes, *, now: float) -> Client:
    """The client a fetched document describes.

    Raises:
        DocumentRefused: not a JSON object, a ``client_id`` other than ``url``, a
            secret or a non-public authentication method, or metadata that
            registration would refuse.
    """
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise DocumentRefused("The document is not JSON.") from None
    if not isinstance(document, dict):
        raise DocumentRefused("The document must be a JSON object.")
    if document.get("client_id") != url:
        raise DocumentRefused("The document's client_id must be exactly the URL it is served at.")
    if "client_secret" in document or "client_secret_expires_at" in document:
        raise DocumentRefused("A client metadata document must not hold a client secret.")
    if document.get("token_endpoint_auth_method", "none") != "none":
        raise DocumentRefused(
            "Only public clients are supported: token_endpoint_auth_method must be none."
        )
    try:
        name, uris = check_client_metadata(document, name_required=True)
    except OAuthError as exc:
        raise DocumentRefused(exc.description) from None
    return Client(client_id=url, client_name=name, redirect_uris=uris, created_at=now)


@dataclass(frozen=True)
class _Good:
    client: Client
    fresh_until: float


@dataclass(frozen=True)
class _Refused:
    reason: str
    transient: bool


class ClientDocuments:
    def __init__(
        self,
        fetcher: PublicFetcher,
        *,
        fetches_per_minute: int = 60,
        cache_size: int = 5000,
        default_ttl_s: float = 300.0,
        max_ttl_s: float = 86400.0,
        stale_s: float = 86400.0,
        failure_ttl_s: float = 30.0,
        budget: Budget | None = None,
        shares: Shares = DEFAULT_SHARES,
        lookup_wait_s: float = LOOKUP_WAIT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``stale_s``: how long past its freshness a document may still be served when
        it cannot be fetched again for a reason that says nothing about it (the budget
        is spent, the host is down or slow). A refused document replaces it at once.
        ``budget``: where new fetches are counted (shared by every process); by default
        in this process's memory, ``fetches_per_minute`` with ``shares``. ``shares``
        also divides this process's lookup threads (``LOOKUP_THREADS``) between
        addresses and networks; a fetch waits ``lookup_wait_s`` at most for its place."""
        self._fetcher = fetcher
        # One budget for everyone, of which one network and one address prefix may
        # spend only their shares: flooding it takes many networks, and a known client
        # is served regardless (below, and from its stored row in ClientDirectory).
        self._budget = budget or PrefixedBudget(fetches_per_minute, 60, shares=shares, clock=clock)
        # The lookup threads are a global budget too, spent by time rather than count: a
        # nameserver that never answers holds its thread past the fetch's timeout. So each
        # address and network may hold only its share of them, until the lookup ends.
        self._lookups = KeyedShares()
        self.lookups_per_address, self.lookups_per_network = shares.of(LOOKUP_THREADS)
        self._lookup_wait_s = lookup_wait_s
        self._cache: ExpiringMap[_Good | _Refused] = ExpiringMap(cache_size, clock)
        self._inflight: dict[str, asyncio.Task[Client]] = {}
        self._default_ttl_s = default_ttl_s
        self._max_ttl_s = max_ttl_s
        self._stale_s = stale_s
        self._failure_ttl_s = failure_ttl_s
        self._clock = clock

    async def client(self, url: str, *, prefix: str = "", may_fetch: bool = True) -> Client:
        """The client ``url`` identifies, from the cache or a fresh fetch.

        ``prefix``: the budget key of whoever asks (auth.client_address): a new fetch
        spends the global budget and that prefix's share of it. ``may_fetch`` False:
        the request failed its own cheap checks, so only a cached copy is served.

        Raises:
            DocumentRefused: the URL, the fetch or the document was refused.
        """
        check_client_id_url(url)
        try:
            self._fetcher.precheck(url)
        except FetchRefused as exc:
            refusals.warning(
                "oauth.client_document_refused",
                prefix,
                host=urlsplit(url).hostname,
                reason=exc.reason,
            )
            raise DocumentRefused(exc.reason) from None
        entry = self._cache.get(url)
        if isinstance(entry, _Refused):
            raise DocumentRefused(entry.reason, transient=entry.transient)
        if entry is not None and self._clock() < entry.fresh_until:
            self._cache.touch(url)  # in use: the last to be evicted
            return entry.client
        try:
            if not may_fetch:
                raise DocumentRefused(
                    "The sign-in request is incomplete (it needs response_type=code and a "
                    "PKCE S256 code_challenge), so the document was not fetched.",
                    transient=True,
                )
            return await self._fetch_shared(url, prefix)
        except DocumentRefused as exc:
            if entry is None or not exc.transient:
                raise
            # Flooding the budget or the host must not lock out a client we know.
            self._cache.touch(url)
            refusals.warning(
                "oauth.client_document_stale",
                prefix,
                host=urlsplit(url).hostname,
                reason=exc.reason,
            )
            return entry.client

    async def _fetch_shared(self, url: str, prefix: str) -> Client:
        task = self._inflight.get(url)
        share = None
        if task is None:
            # The lookup's place first, then the budget: a refusal here spends nothing.
            share = await self._lookup_share(url, prefix)
            task = self._inflight.get(url)  # another caller may have started it meanwhile
            if task is None:
                try:
                    wait = await self._budget.take(prefix)  # 0: spent one; else refused
                except BaseException:
                    if share is not None:
                        share.release()
                    raise
                if wait:
                    if share is not None:
                        share.release()
                    raise DocumentRefused(
                        "Too many new applications are signing in right now; "
                        "try again in a minute.",
                        transient=True,
                    )
                task = self._inflight.get(url)  # and again, while the budget was asked
            if task is not None and share is not None:
                share.release()  # that fetch's lookup has its own place
                share = None
        if task is None:
            task = asyncio.ensure_future(self._load(url, share, prefix))
            self._inflight[url] = task
            task.add_done_callback(lambda _: self._inflight.pop(url, None))
            if share is not None:  # a task cancelled before it ran still gives it back
                release = share.release
                task.add_done_callback(lambda _: release())
        # Shielded: one caller giving up must not cancel the fetch the others wait on.
        return await asyncio.shield(task)

    async def _lookup_share(self, url: str, prefix: str) -> HeldShare | None:
        """A place for ``url``'s host lookup in ``prefix``'s and its network's shares of
        the lookup threads (None: an address literal, nothing to look up).

        Raises:
            DocumentRefused: no place within ``lookup_wait_s`` (transient: nothing is
                said about the document, and nothing was spent).
        """
        host = urlsplit(url).hostname or ""
        try:
            ipaddress.ip_address(host)
            return None
        except ValueError:
            pass
        keys = [  # always the address, then its network: no two fetches wait on each other
            (f"address:{prefix}", self.lookups_per_address),
            (f"network:{network_key(prefix)}", self.lookups_per_network),
        ]
        try:
            async with asyncio.timeout(self._lookup_wait_s):
                return await self._lookups.take(keys)
        except TimeoutError:
            raise DocumentRefused(
                "Too many sign-ins from your network are still waiting for their "
                "applications' host names to resolve; try again in a minute.",
                transient=True,
            ) from None

    async def _load(self, url: str, share: HeldShare | None = None, prefix: str = "") -> Client:
        host = urlsplit(url).hostname
        started = time.monotonic()
        try:
            fetched = await self._fetcher.get(url, share=share)
            client = parse_document(url, fetched.body, now=self._clock())
        except (FetchRefused, DocumentRefused) as exc:
            refusals.warning("oauth.client_document_refused", prefix, host=host, reason=exc.reason)
            known = isinstance(self._cache.get(url), _Good)
            if not (exc.transient and known):  # a transient failure keeps a known document
                until = self._clock() + self._failure_ttl_s
                self._cache.put_evicting(url, _Refused(exc.reason, exc.transient), until)
            # A new exception each time: a cached one would grow its traceback forever.
            raise DocumentRefused(exc.reason, transient=exc.transient) from None
        ttl = cache_lifetime(
            fetched.cache_control, default_s=self._default_ttl_s, max_s=self._max_ttl_s
        )
        now = self._clock()
        if ttl > 0:
            self._cache.put_evicting(url, _Good(client, now + ttl), now + ttl + self._stale_s)
        else:
            self._cache.pop(url)  # no-store: keep nothing, not even an older copy
        log.info(
            "oauth.client_document_fetched",
            host=host,
            bytes=len(fetched.body),
            cached_s=ttl,
            ms=round((time.monotonic() - started) * 1000, 1),
        )
        return client
