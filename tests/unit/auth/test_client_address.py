"""The client's address behind trusted proxies, and the prefix its budgets are keyed by."""

from __future__ import annotations

import ipaddress

import pytest

from auth.client_address import (
    ClientAddresses,
    forwarded_for_nodes,
    parse_address,
    parse_trusted_proxies,
    prefix_key,
)

PROXY = "10.0.0.2"
TRUSTED = parse_trusted_proxies("10.0.0.0/24, ::1")


def xff(*values: str) -> list[tuple[str, str]]:
    return [("x-forwarded-for", value) for value in values]


def test_without_trusted_proxies_the_headers_are_the_clients_own_words() -> None:
    addresses = ClientAddresses()
    spoofed = [*xff("198.51.100.7"), ("forwarded", "for=198.51.100.8")]
    assert addresses.client_address("203.0.113.5", spoofed) == "203.0.113.5"


def test_an_untrusted_peer_cannot_choose_its_address() -> None:
    addresses = ClientAddresses(TRUSTED)
    assert addresses.client_address("203.0.113.5", xff("198.51.100.7")) == "203.0.113.5"


def test_from_a_trusted_proxy_the_rightmost_untrusted_address_is_the_client() -> None:
    addresses = ClientAddresses(TRUSTED)
    # The client wrote the first entry itself; the proxy appended what it saw.
    header = xff("1.1.1.1, 198.51.100.7, 10.0.0.9")
    assert addresses.client_address(PROXY, header) == "198.51.100.7"


def test_several_header_lines_are_read_in_order() -> None:
    addresses = ClientAddresses(TRUSTED)
    assert addresses.client_address(PROXY, xff("1.1.1.1", "198.51.100.7")) == "198.51.100.7"


def test_a_trusted_proxy_without_the_header_is_itself_the_client() -> None:
    assert ClientAddresses(TRUSTED).client_address(PROXY, []) == PROXY


def test_garbage_in_the_header_stops_the_walk_at_the_last_trusted_hop() -> None:
    addresses = ClientAddresses(TRUSTED)
    assert addresses.client_address(PROXY, xff("198.51.100.7, unknown")) == PROXY
    assert addresses.client_address(PROXY, xff("198.51.100.7, x, 10.0.0.9")) == "10.0.0.9"


def test_only_the_configured_header_is_read() -> None:
    # A proxy that sets X-Forwarded-For passes a client's Forwarded through untouched.
    headers = [("forwarded", "for=192.0.2.99"), *xff("198.51.100.7")]
    assert ClientAddresses(TRUSTED).client_address(PROXY, headers) == "198.51.100.7"
    forwarded = ClientAddresses(TRUSTED, "forwarded")
    headers = [*xff("192.0.2.99"), ("Forwarded", 'for="[2001:db8:cafe::17]:4711";proto=https')]
    assert forwarded.client_address(PROXY, headers) == "2001:db8:cafe::17"


def test_forwarded_elements_and_quoting() -> None:
    value = 'for=192.0.2.43, for="[2001:db8::1]";by=10.0.0.2, proto=https;for="a,b", by=x'
    assert forwarded_for_nodes(value) == ["192.0.2.43", '"[2001:db8::1]"', '"a,b"', ""]
    addresses = ClientAddresses(TRUSTED, "forwarded")
    headers = [("forwarded", "for=198.51.100.7, for=10.0.0.9")]
    assert addresses.client_address(PROXY, headers) == "198.51.100.7"


@pytest.mark.parametrize(
    ("written", "address"),
    [
        ("198.51.100.7", "198.51.100.7"),
        (" 198.51.100.7:4711 ", "198.51.100.7"),
        ('"198.51.100.7:4711"', "198.51.100.7"),
        ("2001:db8::1", "2001:db8::1"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("::ffff:198.51.100.7", "198.51.100.7"),  # a mapped IPv4 address is that address
        ("fe80::1%eth0", "fe80::1"),
    ],
)
def test_addresses_as_proxies_write_them(written: str, address: str) -> None:
    assert parse_address(written) == ipaddress.ip_address(address)


@pytest.mark.parametrize("written", ["unknown", "_hidden", "", "[2001:db8::1", "1.2.3"])
def test_what_is_no_address(written: str) -> None:
    assert parse_address(written) is None


def test_an_ipv6_client_is_counted_by_its_64() -> None:
    one = prefix_key(ipaddress.IPv6Address("2001:db8:1:2::1"))
    other = prefix_key(ipaddress.IPv6Address("2001:db8:1:2:ffff:ffff:ffff:ffff"))
    assert one == other == "2001:db8:1:2::/64"
    assert prefix_key(ipaddress.IPv6Address("2001:db8:1:3::1")) != one
    assert prefix_key(ipaddress.IPv4Address("198.51.100.7")) == "198.51.100.7"


def test_trusted_proxies_are_parsed_strictly() -> None:
    assert parse_trusted_proxies("") == ()
    assert parse_trusted_proxies(" 10.0.0.1 , 2001:db8::/32,") == (
        ipaddress.ip_network("10.0.0.1/32"),
        ipaddress.ip_network("2001:db8::/32"),
    )
    with pytest.raises(ValueError, match=r"'10\.0\.0\.300' is not an IP address or network"):
        parse_trusted_proxies("10.0.0.1, 10.0.0.300")
