"""Client ID Metadata Documents: URL rules, document rules, caching, budget, sharing a fetch.

Fetches are real (TLS on loopback through PublicFetcher, with an address policy
that admits loopback); the refusals of private addresses use the production policy.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from dns_testkit import SlowNameserver
from fetch_testkit import Clock, Resolver, SpyNetwork, documents, loopback_too
from tls_testkit import Answer, DocumentServer, ThrowawayCA

from auth.client_documents import (
    ClientDocuments,
    DocumentRefused,
    cache_lifetime,
    check_client_id_url,
    parse_document,
)
from auth.ratelimit import Shares
from auth.safe_fetch import PublicFetcher
from auth.store import Client


@pytest.mark.parametrize(
    "url",
    [
        "http://client.example/meta.json",
        "https://client.example",
        "https://client.example/",
        "https://client.example/a/../meta.json",
        "https://client.example/./meta.json",
        "https://client.example/meta.json#frag",
        "https://user:pw@client.example/meta.json",
        "https://client.example:99999/meta.json",
        "https://client.example/" + "a" * 600,
        "https://client.example/meta json",
        "https://client.example/m\u00e9ta.json",  # not ASCII
        "https://client.example/%2e%2e/meta.json",  # an encoded dot segment
        "https://client.example/a/%2E/meta.json",
        "https://client.example/meta.json;v=1",  # ;params are dropped when fetched
        "javascript:alert(1)",
    ],
)
def test_bad_client_id_urls_are_refused_before_any_fetch(url: str) -> None:
    with pytest.raises(DocumentRefused):
        check_client_id_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "https://claude.ai/oauth/mcp-oauth-client-metadata",
        "https://client.example:8443/meta.json",
        "https://client.example/meta.json?v=2",
    ],
)
def test_good_client_id_urls_pass(url: str) -> None:
    check_client_id_url(url)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, 300.0),
        ("public, max-age=60", 60.0),
        ('max-age="120"', 120.0),
        ("max-age=999999999", 86400.0),
        ("no-store", 0.0),
        ("no-cache, max-age=60", 0.0),
        ("private", 300.0),
    ],
)
def test_cache_lifetime_follows_cache_control(header: str | None, seconds: float) -> None:
    assert cache_lifetime(header, default_s=300, max_s=86400) == seconds


URL = "https://client.example/meta.json"
GOOD = {
    "client_id": URL,
    "client_name": "Example client",
    "redirect_uris": ["https://client.example/cb", "http://127.0.0.1/cb"],
    "token_endpoint_auth_method": "none",
}


def test_a_good_document_describes_its_client() -> None:
    client = parse_document(URL, json.dumps(GOOD).encode(), now=5.0)
    assert client.client_id == URL
    assert client.client_name == "Example client"
    assert client.redirect_uris == ("https://client.example/cb", "http://127.0.0.1/cb")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"client_id": "https://other.example/meta.json"}, "exactly the URL"),
        ({"client_id": None}, "exactly the URL"),
        ({"client_name": None}, "client_name"),
        ({"client_name": "x" * 101}, "client_name"),
        ({"redirect_uris": []}, "redirect_uris"),
        ({"redirect_uris": ["javascript:alert(1)"]}, "https"),
        ({"redirect_uris": ["http://evil.example/cb"]}, "loopback"),
        ({"redirect_uris": ["https://client.example/cb#x"]}, "fragment"),
        ({"client_secret": "s3cret"}, "secret"),
        ({"token_endpoint_auth_method": "client_secret_basic"}, "public clients"),
        ({"response_types": ["token"]}, "response_types"),
    ],
)
def test_documents_that_registration_would_refuse_are_refused(
    change: dict[str, object], reason: str
) -> None:
    document = {**GOOD, **change}
    document = {k: v for k, v in document.items() if v is not None}
    with pytest.raises(DocumentRefused, match=reason):
        parse_document(URL, json.dumps(document).encode(), now=0)


@pytest.mark.parametrize("body", [b"{", b"[1, 2]", b"\xff\xfe", b'"text"'])
def test_a_body_that_is_not_a_json_object_is_refused(body: bytes) -> None:
    with pytest.raises(DocumentRefused, match="JSON"):
        parse_document(URL, body, now=0)


def publish(server: DocumentServer, path: str, *, cache: str | None = None) -> str:
    url = f"https://client.test:{server.port}{path}"
    headers = {"Cache-Control": cache} if cache else {}
    server.answers[path] = Answer(
        body=json.dumps({**GOOD, "client_id": url}).encode(), headers=headers
    )
    return url


async def test_a_document_is_fetched_once_and_cached_for_its_max_age(
    ca: ThrowawayCA, server: DocumentServer
) -> None:
    clock = Clock()
    url = publish(server, "/meta.json", cache="max-age=60")
    docs = documents(ca, clock)
    first = await docs.client(url)
    again = await docs.client(url)
    assert first == again
    assert first.client_name == "Example client"
    assert len(server.seen) == 1
    clock.now += 61
    await docs.client(url)
    assert len(server.seen) == 2, "refetched once max-age passed"


async def test_no_store_means_every_sign_in_reads_the_document_again(
    ca: ThrowawayCA, server: DocumentServer
) -> None:
    url = publish(server, "/fresh.json", cache="no-store")
    docs = documents(ca, Clock())
    for _ in range(3):
        await docs.client(url)
    assert len(server.seen) == 3


async def test_concurrent_sign_ins_share_one_fetch(ca: ThrowawayCA, server: DocumentServer) -> None:
    url = publish(server, "/meta.json")
    server.answers["/meta.json"].drip_s = 0.001  # long enough for all five to arrive
    docs = documents(ca, Clock())
    clients = await asyncio.gather(*(docs.client(url) for _ in range(5)))
    assert len({c.client_id for c in clients}) == 1
    assert len(server.seen) == 1


async def test_a_refusal_is_remembered_briefly(ca: ThrowawayCA, server: DocumentServer) -> None:
    clock = Clock()
    url = f"https://client.test:{server.port}/missing.json"
    docs = documents(ca, clock, failure_ttl_s=30)
    for _ in range(2):
        with pytest.raises(DocumentRefused, match="HTTP 404"):
            await docs.client(url)
    assert len(server.seen) == 1
    clock.now += 31
    with pytest.raises(DocumentRefused):
        await docs.client(url)
    assert len(server.seen) == 2


async def test_new_fetches_have_a_global_budget_and_cached_documents_do_not_spend_it(
    ca: ThrowawayCA, server: DocumentServer
) -> None:
    docs = documents(ca, Clock(), fetches_per_minute=2)
    first, second, third = (publish(server, f"/c{i}.json") for i in range(3))
    await docs.client(first, prefix="198.51.100.1")
    await docs.client(second, prefix="198.51.100.2")
    with pytest.raises(DocumentRefused, match="Too many new applications"):
        await docs.client(third, prefix="198.51.100.3")
    assert len(server.seen) == 2, "the refused one was not fetched"
    await docs.client(first, prefix="198.51.100.3")  # cached: still served
    assert len(server.seen) == 2


async def test_one_network_and_one_address_spend_only_their_share_of_the_budget(
    ca: ThrowawayCA, server: DocumentServer
) -> None:
    # 20 a minute: one address may spend 5% (1), one network (an IPv6 /48) 10% (2).
    docs = documents(ca, Clock(), fetches_per_minute=20, shares=Shares(5, 10))
    flood = [publish(server, f"/flood{i}.json") for i in range(4)]
    await docs.client(flood[0], prefix="2001:db8:0:1::/64")
    with pytest.raises(DocumentRefused, match="Too many new applications"):
        await docs.client(flood[1], prefix="2001:db8:0:1::/64")
    await docs.client(flood[1], prefix="2001:db8:0:2::/64")
    with pytest.raises(DocumentRefused, match="Too many new applications"):
        await docs.client(flood[2], prefix="2001:db8:0:3::/64")  # the same /48
    honest = publish(server, "/honest.json")
    assert (await docs.client(honest, prefix="2001:db8:1:1::/64")).client_id == honest
    assert len(server.seen) == 3


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/meta.json",
        "https://[::1]/meta.json",
        "https://10.0.0.1/meta.json",
        "https://localhost/meta.json",
        "https://app.localhost/meta.json",
        "https://169.254.169.254/latest/meta-data",
        # Numbers getaddrinfo reads as 127.0.0.1 (issue 23, finding 8).
        "https://127.1/meta.json",
        "https://2130706433/meta.json",
        "https://0x7f.1/meta.json",
        "https://017700000001/meta.json",
        "https://localhost./meta.json",
    ],
)
async def test_urls_that_can_never_be_fetched_spend_no_budget(url: str) -> None:
    network = SpyNetwork()
    fetcher = PublicFetcher(network=network, resolver=Resolver({}))
    docs = ClientDocuments(fetcher, fetches_per_minute=1)
    for _ in range(3):
        with pytest.raises(DocumentRefused, match=r"private, loopback or link-local|a number"):
            await docs.client(url)
    assert network.connected_to == []
    # The one fetch of the minute is still there: the refusals spent nothing.
    with pytest.raises(DocumentRefused, match="does not resolve"):
        await docs.client("https://unreachable.invalid/meta.json")


async def test_a_malformed_sign_in_request_fetches_nothing(
    ca: ThrowawayCA, server: DocumentServer
) -> None:
    docs = documents(ca, Clock())
    url = publish(server, "/meta.json")
    with pytest.raises(DocumentRefused, match="sign-in request is incomplete"):
        await docs.client(url, may_fetch=False)
    assert server.seen == []
    await docs.client(url)
    assert (await docs.client(url, may_fetch=False)).client_id == url, "a cached copy is fine"


async def test_the_cloud_metadata_address_is_refused_without_a_connection() -> None:
    network = SpyNetwork()
    docs = ClientDocuments(PublicFetcher(network=network))
    with pytest.raises(DocumentRefused, match="private, loopback or link-local"):
        await docs.client("https://169.254.169.254/latest/meta-data")
    assert network.connected_to == []


async def test_a_known_document_is_served_stale_while_the_budget_is_spent(
    ca: ThrowawayCA, server: DocumentServer
) -> None:
    clock = Clock()
    docs = documents(ca, clock, fetches_per_minute=2, default_ttl_s=30)
    known = publish(server, "/known.json")
    await docs.client(known, prefix="203.0.113.9")
    # The flood spends the budget.
    await docs.client(publish(server, "/flood.json"), prefix="198.51.100.1")
    clock.now += 45  # no longer fresh, and the minute's budget is still spent
    assert (await docs.client(known)).client_id == known
    assert len(server.seen) == 2, "served from the stale copy, nothing fetched"
    with pytest.raises(DocumentRefused, match="Too many new applications"):
        await docs.client(publish(server, "/new.json"))


@pytest.mark.parametrize(
    ("answer", "served_stale"),
    [
        (Answer(503, b"down"), True),  # says nothing about the document
        (Answer(body=b"{" + b" " * 50 + b"}", drip_s=0.05), True),  # too slow: timed out
        (Answer(404, b"gone"), False),  # withdrawn: refused at once despite the old copy
        (Answer(body=b'{"client_id": "https://elsewhere.test/x"}'), False),  # now invalid
    ],
)
async def test_after_a_failed_refetch_only_a_transient_failure_serves_the_old_copy(
    ca: ThrowawayCA, server: DocumentServer, answer: Answer, served_stale: bool
) -> None:
    clock = Clock()
    docs = documents(ca, clock, default_ttl_s=60, timeout_s=0.5)
    known = publish(server, "/known.json")
    await docs.client(known)
    server.answers["/known.json"] = answer
    clock.now += 120
    if served_stale:
        for _ in range(2):
            assert (await docs.client(known)).client_id == known
        assert len(server.seen) == 3, "each attempt tried the host again"
    else:
        with pytest.raises(DocumentRefused):
            await docs.client(known)


async def test_a_remembered_refusal_is_raised_afresh_each_time(
    ca: ThrowawayCA, server: DocumentServer
) -> None:
    docs = documents(ca, Clock())
    url = f"https://client.test:{server.port}/missing.json"
    caught = []
    for _ in range(3):
        with pytest.raises(DocumentRefused) as refused:
            await docs.client(url)
        caught.append(refused.value)
    assert len({id(exc) for exc in caught}) == 3
    assert all(len(list(_frames(exc))) < 20 for exc in caught), "tracebacks do not pile up"


def _frames(exc: BaseException) -> list[object]:
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    return frames


async def test_a_stale_copy_is_served_only_for_stale_s_past_its_freshness(
    ca: ThrowawayCA, server: DocumentServer
) -> None:
    clock = Clock()
    docs = documents(ca, clock, default_ttl_s=60, stale_s=600)
    known = publish(server, "/known.json")
    await docs.client(known)
    server.answers["/known.json"] = Answer(503, b"down")
    clock.now += 60 + 599
    assert (await docs.client(known)).client_id == known
    clock.now += 2  # now past freshness + stale_s: the copy is gone
    with pytest.raises(DocumentRefused, match="HTTP 503"):
        await docs.client(known)


async def test_no_store_drops_an_older_cached_copy(ca: ThrowawayCA, server: DocumentServer) -> None:
    clock = Clock()
    docs = documents(ca, clock, default_ttl_s=60)
    url = publish(server, "/doc.json")
    await docs.client(url)
    clock.now += 61
    publish(server, "/doc.json", cache="no-store")
    await docs.client(url)  # refetched; no-store: nothing may be kept
    server.answers["/doc.json"] = Answer(503, b"down")
    with pytest.raises(DocumentRefused, match="HTTP 503"):
        await docs.client(url)  # no stale copy to fall back on


async def test_a_document_in_use_is_evicted_last(ca: ThrowawayCA, server: DocumentServer) -> None:
    clock = Clock()
    docs = documents(ca, clock, cache_size=2)
    used, other, newest = (publish(server, f"/{name}.json") for name in ("used", "other", "new"))
    await docs.client(used)
    await docs.client(other)
    await docs.client(used)  # a cache hit moves it to the back of the eviction line
    await docs.client(newest)  # the cache is full: "other" goes
    fetched = len(server.seen)
    await docs.client(used)
    assert len(server.seen) == fetched, "the document in use stayed cached"
    await docs.client(other)
    assert len(server.seen) == fetched + 1, "the unused one was evicted"


async def test_the_budget_refills_after_a_minute(ca: ThrowawayCA, server: DocumentServer) -> None:
    clock = Clock()
    docs = documents(ca, clock, fetches_per_minute=1)
    await docs.client(publish(server, "/a.json"), prefix="198.51.100.1")
    with pytest.raises(DocumentRefused, match="Too many new applications"):
        await docs.client(publish(server, "/b.json"), prefix="198.51.100.2")
    clock.now += 61
    assert (await docs.client(publish(server, "/b.json"))).client_name == "Example client"


async def test_one_caller_giving_up_does_not_cancel_the_shared_fetch(
    ca: ThrowawayCA, server: DocumentServer
) -> None:
    url = publish(server, "/slow.json")
    server.answers["/slow.json"].drip_s = 0.002
    docs = documents(ca, Clock())
    impatient = asyncio.ensure_future(docs.client(url))
    patient = asyncio.ensure_future(docs.client(url))
    await asyncio.sleep(0.05)
    impatient.cancel()
    assert (await patient).client_id == url
    assert impatient.cancelled()
    assert len(server.seen) == 1


# -- the lookup threads' shares (issue 23, finding 8's class) --------------------------


def looked_up_for_real(ca: ThrowawayCA, **kw: float) -> ClientDocuments:
    """Documents whose hosts are looked up by the production resolver, on the fetcher's
    own threads (getaddrinfo is the slow_dns fixture's: client.test is on loopback);
    the fetch's own timeout is out of the way, so only a share can end a wait."""
    fetcher = PublicFetcher(
        allow=loopback_too,
        ssl_context=ca.client_context(),
        network=SpyNetwork(),
        ports=None,
        timeout_s=600.0,
    )
    return ClientDocuments(fetcher, shares=Shares(5, 10), **kw)  # type: ignore[arg-type]


async def fetched_promptly(docs: ClientDocuments, url: str, prefix: str) -> None:
    # Generous: served in milliseconds with its share, never while the threads are held.
    honest = asyncio.create_task(docs.client(url, prefix=prefix))
    done, _ = await asyncio.wait({honest}, timeout=60)
    assert done == {honest}, "the fetch waited behind another's slow lookups"
    assert honest.result().client_id == url


async def until_done(tasks: list[asyncio.Task[Client]], count: int) -> list[asyncio.Task[Client]]:
    """The tasks done once ``count`` of them are (bounded generously)."""
    pending = set(tasks)
    async with asyncio.timeout(60):
        while len(tasks) - len(pending) < count:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    return [task for task in tasks if task.done()]


async def test_one_network_s_slow_lookups_leave_another_network_s_fetch_served(
    ca: ThrowawayCA, server: DocumentServer, slow_dns: SlowNameserver
) -> None:
    # Ten addresses of one /48 sign in with 30 hosts whose nameserver never answers,
    # within their fetch shares: without shares of the lookup threads they held every
    # thread, and a new client's lookup from elsewhere waited behind them.
    slow_dns.answer = "127.0.0.1"
    docs = looked_up_for_real(ca, fetches_per_minute=1000, lookup_wait_s=0.5)
    assert (docs.lookups_per_address, docs.lookups_per_network) == (1, 2)
    flood = [
        asyncio.create_task(
            docs.client(f"https://h{n}.slow.example/m.json", prefix=f"2001:db8:bad:{n % 10}::/64")
        )
        for n in range(30)
    ]
    try:
        for _ in range(docs.lookups_per_network):  # the network's share is in its threads
            assert await asyncio.to_thread(slow_dns.entered.acquire, timeout=60)
        await fetched_promptly(docs, publish(server, "/honest.json"), "198.51.100.7")
        # The rest of the flood is refused, in words the client can act on, and none of
        # it reached a thread.
        refused = await until_done(flood, 28)
        for task in refused:
            with pytest.raises(DocumentRefused, match="still waiting for their applications'"):
                task.result()
            assert task.exception().transient  # type: ignore[union-attr]
        assert not slow_dns.entered.acquire(timeout=0), "only the network's two looked up"
    finally:
        slow_dns.release.set()
        results = await asyncio.gather(*flood, return_exceptions=True)
    assert all(isinstance(result, DocumentRefused) for result in results), results
    assert docs._lookups.idle  # every place given back once its lookup ended


async def test_one_address_s_slow_lookups_leave_its_neighbour_s_fetch_served(
    ca: ThrowawayCA, server: DocumentServer, slow_dns: SlowNameserver
) -> None:
    slow_dns.answer = "127.0.0.1"
    docs = looked_up_for_real(ca, fetches_per_minute=1000, lookup_wait_s=0.5)
    flood = [
        asyncio.create_task(docs.client(f"https://h{n}.slow.example/m.json", prefix="192.0.2.9"))
        for n in range(3)
    ]
    try:
        assert await asyncio.to_thread(slow_dns.entered.acquire, timeout=60)
        # The same /24, another address: the network's second place is its.
        await fetched_promptly(docs, publish(server, "/neighbour.json"), "192.0.2.10")
        await until_done(flood, 2)
        assert not slow_dns.entered.acquire(timeout=0), "one lookup for 192.0.2.9 at a time"
    finally:
        slow_dns.release.set()
        await asyncio.gather(*flood, return_exceptions=True)
    assert docs._lookups.idle


async def test_a_fetch_refused_its_lookup_place_spends_no_budget(
    ca: ThrowawayCA, server: DocumentServer, slow_dns: SlowNameserver
) -> None:
    # 60 a minute: one address may spend 3 fetches and hold 1 lookup.
    slow_dns.answer = "127.0.0.1"
    docs = looked_up_for_real(ca, fetches_per_minute=60, lookup_wait_s=0.2)
    slow = asyncio.create_task(docs.client("https://a.slow.example/m.json", prefix="192.0.2.9"))
    try:
        assert await asyncio.to_thread(slow_dns.entered.acquire, timeout=60)
        for n in range(10):
            with pytest.raises(DocumentRefused, match="still waiting"):
                await docs.client(f"https://b{n}.slow.example/m.json", prefix="192.0.2.9")
    finally:
        slow_dns.release.set()
    with pytest.raises(DocumentRefused, match="does not resolve"):
        await slow  # one fetch spent
    for name in ("one", "two"):  # the other two are still there
        url = publish(server, f"/{name}.json")
        assert (await docs.client(url, prefix="192.0.2.9")).client_id == url
    with pytest.raises(DocumentRefused, match="Too many new applications"):
        await docs.client(publish(server, "/three.json"), prefix="192.0.2.9")


async def test_callers_of_a_url_being_fetched_join_its_lookup_without_a_place_of_their_own(
    ca: ThrowawayCA, slow_dns: SlowNameserver
) -> None:
    docs = looked_up_for_real(ca, lookup_wait_s=0.2)
    url = "https://same.slow.example/m.json"
    callers = [asyncio.create_task(docs.client(url, prefix="192.0.2.9")) for _ in range(5)]
    try:
        assert await asyncio.to_thread(slow_dns.entered.acquire, timeout=60)
        await asyncio.sleep(1)  # past lookup_wait_s: a caller that needed a place is refused
        assert not any(task.done() for task in callers), "a caller did not join the fetch"
    finally:
        slow_dns.release.set()
    for result in await asyncio.gather(*callers, return_exceptions=True):
        assert isinstance(result, DocumentRefused), result
        assert "does not resolve" in result.reason
    assert not slow_dns.entered.acquire(timeout=0), "one lookup for all five"
