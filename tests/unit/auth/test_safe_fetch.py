"""PublicFetcher against a real TLS server on loopback.

Loopback is private, so these tests pass an address policy that admits
127.0.0.1 (and a resolver that maps test names to it); everything else is the
production path: one resolution, a pinned connection, TLS checked against the
URL's host name, the limits. The refusals use the production policy.
"""

from __future__ import annotations

import ipaddress

import httpcore2
import pytest
from fetch_testkit import Resolver, SpyNetwork, loopback_too
from tls_testkit import Answer, DocumentServer, ThrowawayCA

from auth.safe_fetch import (
    FetchRefused,
    PublicFetcher,
    is_public_address,
    system_resolver,
)

NOT_PUBLIC = [
    "169.254.169.254",  # cloud metadata
    "127.0.0.1",
    "10.1.2.3",
    "172.16.0.1",
    "192.168.1.1",
    "100.64.0.1",  # shared address space (carrier NAT)
    "0.0.0.0",
    "255.255.255.255",
    "192.0.2.1",  # documentation
    "224.0.0.1",  # multicast
    "240.0.0.1",  # reserved
    "::1",
    "fe80::1",
    "fc00::1",
    "::ffff:127.0.0.1",  # IPv4-mapped loopback
    "::ffff:169.254.169.254",
    "::ffff:8.8.8.8",  # every embedding form is refused, even of a public address
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8
    "2002:808:808::1",  # 6to4 of 8.8.8.8
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "::a9fe:a9fe",  # IPv4-compatible 169.254.169.254
    "::ffff:0:7f00:1",  # IPv4-translated 127.0.0.1
    "2001::a9fe:a9fe",  # Teredo
    "fec0::1",  # site-local
    "100::1",  # discard-only
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"]


@pytest.mark.parametrize("address", NOT_PUBLIC)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert not is_public_address(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address))


def fetcher(ca: ThrowawayCA, resolver: Resolver, network: SpyNetwork, **kw: float) -> PublicFetcher:
    return PublicFetcher(
        resolver=resolver,
        allow=loopback_too,
        ssl_context=ca.client_context(),
        network=network,
        ports=None,  # the test server listens on a random port
        **kw,  # type: ignore[arg-type]
    )


async def test_the_connection_goes_to_the_checked_address_and_tls_checks_the_name(
    ca: ThrowawayCA, server: DocumentServer
) -> None:
    server.answers["/client.json"] = Answer(
        body=b'{"ok": 1}', headers={"Cache-Control": "max-age=60"}
    )
    resolver = Resolver({"client.test": ["127.0.0.1"]})
    network = SpyNetwork()
    fetched = await fetcher(ca, resolver, network).get(
        f"https://client.test:{server.port}/client.json"
    )
    assert fetched.body == b'{"ok": 1}'
    assert fetched.cache_control == "max-age=60"
    assert resolver.asked == ["client.test"], "resolved exactly once"
    assert network.connected_to == ["127.0.0.1"], "connected to the checked address, pinned"
    assert [s.host for s in server.seen] == [f"client.test:{server.port}"]


async def test_a_certificate_for_another_name_is_refused(
    ca: ThrowawayCA, server: DocumentServer
) -> None:
    server.answers["/client.json"] = Answer(body=b"{}")
    resolver = Resolver({"elsewhere.test": ["127.0.0.1"]})
    with pytest.raises(FetchRefused, match="could not be reached over https") as caught:
        await fetcher(ca, resolver, SpyNetwork()).get(
            f"https://elsewhere.test:{server.port}/client.json"
        )
    assert caught.value.transient, "says nothing about the document: a known one stays usable"


async def test_a_closed_port_reads_like_any_other_connection_failure(ca: ThrowawayCA) -> None:
    async with DocumentServer(ca.server_context()) as closed:
        port = closed.port
    with pytest.raises(FetchRefused, match="could not be reached over https") as caught:
        await fetcher(ca, Resolver({}), SpyNetwork()).get(f"https://127.0.0.1:{port}/x")
    assert caught.value.transient


@pytest.mark.parametrize(
    ("url", "answers"),
    [
        ("https://169.254.169.254/latest/meta-data", {}),
        ("https://[::ffff:127.0.0.1]/x", {}),
        ("https://[::ffff:8.8.8.8]/x", {}),
        ("https://mapped.test/x", {"mapped.test": ["::ffff:8.8.8.8"]}),
        ("https://metadata.test/x", {"metadata.test": ["169.254.169.254"]}),
        ("https://rebind.test/x", {"rebind.test": ["8.8.8.8", "10.0.0.1"]}),
        ("https://intranet.test/x", {"intranet.test": ["fd00::1"]}),
    ],
)
async def test_private_targets_are_never_connected_to(
    url: str, answers: dict[str, list[str]]
) -> None:
    network = SpyNetwork()
    with pytest.raises(FetchRefused, match="private, loopback or link-local"):
        await PublicFetcher(resolver=Resolver(answers), network=network).get(url)
    assert network.connected_to == []


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://nowhere.test/x", "does not resolve"),  # with Resolver({}): no real DNS
        ("https://a..b/x", "not a public domain name"),  # getaddrinfo: UnicodeError
        ("https://" + "l" * 64 + ".test/x", "not a public domain name"),
        ("https://intranet/x", "not a public domain name"),  # the search domains'
        ("https://127.10.0/x", "is a number"),  # glibc reads these as IPv4 addresses
        ("https://2130706433/x", "is a number"),
        ("https://0x7f.1/x", "is a number"),
        ("https://017700000001/x", "is a number"),
        ("http://8.8.8.8/x", "Only https"),
        ("https://8.8.8.8/ä", "ASCII"),
        ("https://8.8.8.8:8443/x", "only from the standard https port"),
        ("https://8.8.8.8:22/x", "only from the standard https port"),
        ("https://8.8.8.8:99999/x", "not valid"),
    ],
)
async def test_what_is_refused_before_any_connection(url: str, reason: str) -> None:
    network = SpyNetwork()
    # The system resolver only for the names getaddrinfo refuses locally (no DNS query).
    resolver = Resolver({}) if url.startswith("https://nowhere.") else system_resolver
    with pytest.raises(FetchRefused, match=reason):
        await PublicFetcher(network=network, resolver=resolver).get(url)
    assert network.connected_to == []


class BrokenNetwork(SpyNetwork):
    """Fails the way no one planned for."""

    async def connect_tcp(self, *args: object, **kwargs: object) -> httpcore2.AsyncNetworkStream:
        raise ValueError("something no one planned for")


async def test_an_unexpected_failure_is_a_refusal_not_a_traceback() -> None:
    fetcher = PublicFetcher(resolver=Resolver({"x.test": ["8.8.8.8"]}), network=BrokenNetwork())
    with pytest.raises(FetchRefused, match=r"download failed \(ValueError\)") as caught:
        await fetcher.get("https://x.test/x")
    assert caught.value.transient


async def test_redirects_are_not_followed(ca: ThrowawayCA, server: DocumentServer) -> None:
    server.answers["/moved"] = Answer(302, headers={"Location": "https://169.254.169.254/"})
    with pytest.raises(FetchRefused, match="redirect"):
        await fetcher(ca, Resolver({}), SpyNetwork()).get(f"https://127.0.0.1:{server.port}/moved")
    assert [s.path for s in server.seen] == ["/moved"]


async def test_a_status_other_than_200_is_refused(ca: ThrowawayCA, server: DocumentServer) -> None:
    with pytest.raises(FetchRefused, match="HTTP 404"):
        await fetcher(ca, Resolver({}), SpyNetwork()).get(f"https://127.0.0.1:{server.port}/none")


@pytest.mark.parametrize("content_length", [None, -1, 10])
async def test_a_body_over_the_limit_is_refused_whatever_the_headers_say(
    ca: ThrowawayCA, server: DocumentServer, content_length: int | None
) -> None:
    server.answers["/big"] = Answer(body=b"x" * 6000, content_length=content_length)
    get = fetcher(ca, Resolver({}), SpyNetwork()).get(f"https://127.0.0.1:{server.port}/big")
    if content_length == 10:
        # A server that under-declares is cut at its own length: never more than declared.
        assert len((await get).body) == 10
        return
    with pytest.raises(FetchRefused, match="larger than 5120 bytes"):
        await get


async def test_the_limit_admits_a_document_of_exactly_the_limit(
    ca: ThrowawayCA, server: DocumentServer
) -> None:
    server.answers["/edge"] = Answer(body=b"y" * 5120, content_length=-1)
    fetched = await fetcher(ca, Resolver({}), SpyNetwork()).get(
        f"https://127.0.0.1:{server.port}/edge"
    )
    assert len(fetched.body) == 5120


async def test_a_slow_server_runs_into_the_deadline(
    ca: ThrowawayCA, server: DocumentServer
) -> None:
    server.answers["/slow"] = Answer(body=b"{" + b" " * 100 + b"}", drip_s=0.05)
    with pytest.raises(FetchRefused, match=r"within 0\.5 s") as caught:
        await fetcher(ca, Resolver({}), SpyNetwork(), timeout_s=0.5).get(
            f"https://127.0.0.1:{server.port}/slow"
        )
    assert caught.value.transient
