"""Network "restricted"'s rules: allow-lists, addresses never reached, Squid's configuration,
the ACL helper's answers and how the proxy's log is read."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from app.egress import acl_helper as egress_acl_helper
from app.egress.rules import (
    DEFAULT_ALLOWLIST,
    NOT_PUBLIC,
    SquidPlan,
    clamp_allowlist,
    matches,
    not_public_ranges,
    parse_allowlist,
    squid_conf,
    squid_domains,
)
from app.egress.sockets import parse_ss
from app.egress.usage import (
    LogLine,
    ProxyClient,
    account,
    notice_text,
    open_bytes,
    read_new_lines,
)


def test_allowlists_are_parsed_and_bad_names_refused() -> None:
    assert parse_allowlist("PyPI.org, files.pythonhosted.org pypi.org\n.example.org") == (
        "pypi.org",
        "files.pythonhosted.org",
        ".example.org",
    )
    for bad in ("http://pypi.org", "pypi.org:443", "*.example.org", "a..b", "-a.org"):
        with pytest.raises(ValueError, match="not a host name"):
            parse_allowlist(bad)


def test_a_dot_entry_covers_subdomains_and_a_plain_one_only_itself() -> None:
    assert matches("pypi.org", ("pypi.org",))
    assert not matches("evil.pypi.org", ("pypi.org",))
    assert not matches("pypi.org.evil.com", ("pypi.org",))
    assert matches("a.b.example.org", (".example.org",))
    assert matches("example.org", (".example.org",))
    assert not matches("badexample.org", (".example.org",))


def test_an_experiment_gets_at_most_the_ceiling_and_the_rest_is_reported() -> None:
    ceiling = ("pypi.org", "files.pythonhosted.org", ".example.org")
    assert clamp_allowlist(None, ceiling).names == ceiling
    kept = clamp_allowlist(["pypi.org", "evil.com", "a.example.org", ".other.org"], ceiling)
    assert kept.names == ("pypi.org", "a.example.org")
    assert kept.warning is not None
    assert "evil.com, .other.org are not on this server's allow-list" in kept.warning
    # Asking for a whole domain the ceiling only names in part is refused.
    assert clamp_allowlist([".pythonhosted.org"], ceiling).names == ()
    assert clamp_allowlist(["pypi.org"], ceiling).warning is None


def test_the_default_ceiling_is_the_public_registries() -> None:
    assert {"pypi.org", "registry.npmjs.org", "crates.io", "proxy.golang.org", "github.com"} <= set(
        DEFAULT_ALLOWLIST
    )


@pytest.mark.parametrize(
    "address",
    [
        *("127.0.0.1", "10.0.0.1", "172.16.5.4", "192.168.1.1", "169.254.169.254"),
        *("100.64.0.1", "0.0.0.0", "::1", "fe80::1", "fd00::1", "2001:db8::1", "224.0.0.1"),
    ],
)
def test_every_internal_address_is_in_a_refused_range(address: str) -> None:
    ip = ipaddress.ip_address(address)
    assert any(ip in ipaddress.ip_network(net) for net in NOT_PUBLIC)


def test_public_addresses_are_not_refused_but_the_hosts_own_are() -> None:
    public = ipaddress.ip_address("151.101.0.223")  # pypi.org's
    assert not any(public in ipaddress.ip_network(net) for net in NOT_PUBLIC)
    ranges = not_public_ranges(["44.1.2.3", "127.0.0.1", "fe80::1%eth0", "44.1.2.3"])
    assert ranges.count("44.1.2.3/32") == 1
    assert ranges.count("127.0.0.0/8") == 1  # already covered: not repeated


def test_squid_refuses_by_default_and_checks_addresses_after_the_names(tmp_path: Path) -> None:
    conf = squid_conf(
        SquidPlan(
            listen="172.30.0.1:3128",
            workdir=tmp_path,
            ceiling=("pypi.org",),
            not_public=NOT_PUBLIC,
            helper=("/usr/bin/python3", "/h.py", "/state.json"),
            hosts_file=None,
            user="proxy",
        )
    )
    lines = conf.splitlines()
    access = [line for line in lines if line.startswith("http_access")]
    assert access == [
        # What Squid would answer itself (its manager, internal pages, TRACE, OPTIONS).
        "http_access deny manager",
        "http_access deny cache_object",
        "http_access deny squid_internal",
        "http_access deny self_answered",
        "http_access deny CONNECT !https_port",
        "http_access deny !CONNECT !http_port",
        "http_access deny !ceiling",
        "http_access deny !experiment_allows",
        "http_access deny not_public",
        "http_access allow all",
    ]
    assert "http_port 172.30.0.1:3128" in lines  # the bridge's gateway only
    assert "hosts_file none" in lines  # only DNS, never the host's /etc/hosts names
    assert "cache deny all" in lines
    assert "acl ceiling dstdomain pypi.org" in lines
    assert "ttl=0 negative_ttl=0" in conf  # a reused address never inherits an answer


def test_the_acl_helper_answers_from_the_state_file(tmp_path: Path) -> None:
    state = {
        "172.30.0.2": {"allow": ["pypi.org", ".example.org"], "blocked": False},
        "172.30.0.3": {"allow": ["pypi.org"], "blocked": True},
    }
    assert egress_acl_helper.allowed(state, "172.30.0.2", "pypi.org")
    assert egress_acl_helper.allowed(state, "172.30.0.2", "a.example.org")
    assert not egress_acl_helper.allowed(state, "172.30.0.2", "npmjs.org")
    assert not egress_acl_helper.allowed(state, "172.30.0.3", "pypi.org"), "over its cap"
    assert not egress_acl_helper.allowed(state, "172.30.0.9", "pypi.org"), "no experiment"


def test_log_lines_are_read_for_who_what_and_how_much() -> None:
    tunnel = LogLine.parse("1764590000.123 172.30.0.2 TCP_TUNNEL/200 5120 700 CONNECT pypi.org:443")
    assert tunnel == LogLine("172.30.0.2", False, 5820, "CONNECT", "pypi.org", 443)
    denied = LogLine.parse(
        "1764590000.123 172.30.0.2 TCP_DENIED/403 3900 180 GET http://example.com:8080/x"
    )
    assert denied == LogLine("172.30.0.2", True, 4080, "GET", "example.com", 8080)
    assert LogLine.parse("garbage") is None
    kept = LogLine.parse("1.0 172.30.0.2 TCP_MISS/200 10 5 GET http://a.example/ 40123")
    assert kept is not None
    assert kept.connection == "172.30.0.2:40123"


def test_each_refusal_gets_its_reason(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text(
        "1 172.30.0.2 TCP_DENIED/403 100 0 CONNECT evil.com:443\n"
        "1 172.30.0.2 TCP_DENIED/403 100 0 CONNECT pypi.org:443\n"
        "1 172.30.0.2 TCP_DENIED/403 100 0 CONNECT pypi.org:22\n"
        "1 172.30.0.9 TCP_DENIED/403 100 0 CONNECT pypi.org:443\n"  # no experiment's
        "1 172.30.0.2 TCP_TUNNEL/200 20000 0 CONNECT pypi.org:443\n"
        "1 172.30.0.3 TCP_DENIED/403 100 0 CONNECT pypi.org:443\n"  # a capped one
        "1 172.30.0.2 TCP_TUNNEL/200 5 0 CONNECT pyp"  # a line being written
    )
    lines, offset = read_new_lines(log, 0)
    assert len(lines) == 6
    assert offset < log.stat().st_size, "the unfinished line waits"
    clients = {
        "172.30.0.2": ProxyClient("c1", "172.30.0.2", ("pypi.org",), "exp_1"),
        "172.30.0.3": ProxyClient("c2", "172.30.0.3", ("pypi.org",), "exp_2", blocked=True),
    }
    done = account(lines, clients)
    assert done.moved == {"exp_1": 20_300, "exp_2": 100}  # for the database
    assert done.refused == {"exp_1": 3, "exp_2": 1}
    assert [r.text for r in done.refusals] == [
        "evil.com:443: not on this experiment's allow-list",
        "pypi.org:443: it resolves to an address that is not public (loopback, private, "
        "link-local or metadata, shared, or this server)",
        "pypi.org:22: only https on port 443 and http on port 80 go through the proxy",
        "pypi.org:443: this experiment has used its egress byte cap, or its sandbox its "
        "daily egress budget",
    ]
    assert done.reasons == ["not_allowed", "not_public", "port", "not_allowed", "cap"]
    assert done.bytes == 20_500
    text = notice_text(
        [r.text for r in done.refusals[:3]], 0, capped=True, allow=("pypi.org",), max_bytes=10_000
    )
    assert "The egress proxy refused 3 connection(s)" in text
    assert "This experiment may reach: pypi.org." in text
    assert "EGRESS_CAP_REACHED: the egress byte cap (10,000 bytes) is used up" in text


def test_open_connections_count_for_their_experiment() -> None:
    clients = {
        "172.30.0.2": ProxyClient("a1", "172.30.0.2", (), "exp_a"),
        "172.30.0.3": ProxyClient(
            "a2", "172.30.0.3", (), "exp_a"
        ),  # two containers, one experiment
        "172.30.0.4": ProxyClient("b1", "172.30.0.4", (), "exp_b"),
    }
    live = {
        "172.30.0.2:40000": 2_000,
        "172.30.0.2:40002": 1_000,
        "172.30.0.3:40000": 2_999,
        "172.30.0.4:40000": 999,
        "172.30.0.9:40000": 10**9,  # no container's
    }
    assert open_bytes(live, {}, clients) == {"exp_a": 5_999, "exp_b": 999}


def test_requests_logged_on_a_kept_alive_connection_are_not_counted_twice() -> None:
    clients = {"172.30.0.2": ProxyClient("c1", "172.30.0.2", ("deb.debian.org",), "exp_1")}
    # Plain http kept alive: two requests logged while the connection stays open.
    done = account(
        [
            "1 172.30.0.2 TCP_MISS/200 3000 100 GET http://deb.debian.org/a 40000",
            "1 172.30.0.2 TCP_MISS/200 3000 100 GET http://deb.debian.org/b 40000",
        ],
        clients,
    )
    assert done.moved == {"exp_1": 6_200}
    assert done.by_connection == {"172.30.0.2:40000": 6_200}
    # The kernel counts the connection's whole life: 6,200 logged + 3,700 of a third.
    assert open_bytes({"172.30.0.2:40000": 9_900}, done.by_connection, clients) == {"exp_1": 3_700}


def test_ss_output_gives_each_container_its_bytes_both_ways() -> None:
    text = (
        "0      0      172.30.0.1:3128 172.30.0.2:45678\n"
        "\t cubic wscale:7,7 rto:204 bytes_sent:5100 bytes_acked:5000 "
        "bytes_received:700 segs_out:9\n"
        "0      0      172.30.0.1:3128 172.30.0.2:45680\n"
        "\t cubic bytes_acked:100 segs_out:1\n"
        "0      0      172.30.0.1:3128 172.30.0.3:40000\n"
        "\t cubic rto:204 segs_out:1\n"
    )
    assert parse_ss(text) == {
        "172.30.0.2:45678": 5_700,
        "172.30.0.2:45680": 100,
        "172.30.0.3:40000": 0,
    }


def test_names_a_dot_entry_covers_are_left_to_it_for_squid() -> None:
    # Squid refuses to start on "a.example.org .example.org" (FATAL: Bungled).
    names = ("a.example.org", ".example.org", "example.org", ".b.example.org", "pypi.org")
    assert squid_domains(names) == (".example.org", "pypi.org")


def test_a_clone_helper_s_refusals_are_told_though_it_has_no_experiment() -> None:
    clients = {"172.30.0.5": ProxyClient("git1", "172.30.0.5", ("github.com",))}
    done = account(["1 172.30.0.5 TCP_DENIED/403 100 0 CONNECT example.com:443"], clients)
    assert [r.text for r in done.refusals] == [
        "example.com:443: not on this experiment's allow-list"
    ]
    assert done.moved == {}
