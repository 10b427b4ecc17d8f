"""What network "restricted" allows: the allow-lists, the addresses never reached, and
the Squid configuration that enforces both.

Pure functions (no process, no Docker), so the rules can be read and tested alone;
:mod:`app.egress.proxy` runs Squid with them.

* **Names.** The operator's ceiling (``SANDBOX_MCP_EGRESS_ALLOWLIST``) is the most
  any experiment may reach; an experiment may ask for a subset, and names above the
  ceiling are clamped away and reported like other clamps. An entry ``pypi.org``
  matches that name only; ``.example.org`` matches it and every name below it
  (Squid's ``dstdomain`` syntax).
* **Addresses.** Squid resolves every name itself and refuses the request when *any*
  address the name resolves to is not public (loopback, private, link-local with
  the cloud metadata address, shared, multicast, reserved, documentation, and the
  IPv6 equivalents, IPv4-mapped included), or is one of the host's own addresses.
  Squid keeps a resolved answer for at least ``negative_dns_ttl`` (a minute), so the
  address it checked is the one it connects to (no rebinding within a request).
* **Ports.** CONNECT (https, no TLS interception) to 443 only; plain http to 80 only.
* **Only the sites answer.** Squid is one process for every tenant: its cache
  manager (other tenants' URLs, every client address), its internal pages, TRACE
  and OPTIONS are refused before any other rule.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

DEFAULT_ALLOWLIST: Final = (
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    "deb.debian.org",
    "security.debian.org",
    "crates.io",
    "static.crates.io",
    "index.crates.io",
    "proxy.golang.org",
    "sum.golang.org",
    "github.com",
    "codeload.github.com",
    "objects.githubusercontent.com",
)

# Every range that is not the public internet (IANA special-purpose registries).
NOT_PUBLIC: Final = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",  # shared (carrier-grade NAT)
    "127.0.0.0/8",
    "169.254.0.0/16",  # link-local, the cloud metadata address 169.254.169.254
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "64:ff9b::/96",  # NAT64: likewise
    "64:ff9b:1::/48",
    "100::/64",
    "2001::/23",
    "2001:db8::/32",
    "2002::/16",  # 6to4: embeds an IPv4 address
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
)

_NAME = re.compile(
    r"\.?(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
)
HTTPS_PORT: Final = 443
HTTP_PORT: Final = 80


def parse_allowlist(text: str | Iterable[str]) -> tuple[str, ...]:
    """The names of a comma- or space-separated list, lower-cased, in order, once each.

    Raises:
        ValueError: an entry is not a host name (or ``.domain``).
    """
    items = re.split(r"[\s,]+", text) if isinstance(text, str) else list(text)
    names: list[str] = []
    for item in items:
        name = item.strip().lower().rstrip(".")
        if not name:
            continue
        if len(name) > 253 or not _NAME.fullmatch(name):
            raise ValueError(f"{item!r} is not a host name (or .domain for it and below it)")
        if name not in names:
            names.append(name)
    return tuple(names)


def matches(name: str, allowlist: Iterable[str]) -> bool:
    """Whether host ``name`` is on ``allowlist`` (``.domain`` entries cover subdomains)."""
    host = name.lower().rstrip(".")
    for entry in allowlist:
        if entry.startswith("."):
            if host == entry[1:] or host.endswith(entry):
                return True
        elif host == entry:
            return True
    return False


@dataclass(frozen=True)
class ClampedList:
    names: tuple[str, ...]
    warning: str | None


def clamp_allowlist(asked: Iterable[str] | None, ceiling: tuple[str, ...]) -> ClampedList:
    """An experiment's allow-list: what it asked for within the ceiling (all of it if None)."""
    if asked is None:
        return ClampedList(ceiling, None)
    names = parse_allowlist(asked)
    kept = tuple(n for n in names if matches(n.lstrip("."), ceiling) and _within(n, ceiling))
    dropped = [n for n in names if n not in kept]
    if not dropped:
        return ClampedList(kept, None)
    shown = ", ".join(dropped[:10]) + (
        f" and {len(dropped) - 10} more" if len(dropped) > 10 else ""
    )
    return ClampedList(
        kept,
        f"egress_allowlist: {shown} {'is' if len(dropped) == 1 else 'are'} not on this "
        "server's allow-list (check_sandbox_runtime shows it) and was left out",
    )


def _within(name: str, ceiling: tuple[str, ...]) -> bool:
    # ".example.org" asked is within the ceiling only if the ceiling covers all of it.
    return not name.startswith(".") or name in ceiling


def not_public_ranges(host_addresses: Iterable[str] = ()) -> tuple[str, ...]:
    """NOT_PUBLIC plus the host's own addresses (a public one too: the host is no registry)."""
    extra = []
    for address in host_addresses:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        entry = f"{ip}/{ip.max_prefixlen}"
        if entry not in extra and not any(ip in ipaddress.ip_network(n) for n in NOT_PUBLIC):
            extra.append(entry)
    return (*NOT_PUBLIC, *extra)


@dataclass(frozen=True)
class SquidPlan:
    """Everything one Squid instance is configured with."""

    listen: str  # address:port, the restricted network's gateway
    workdir: Path  # logs, the helper's state; writable by Squid's user
    ceiling: tuple[str, ...]
    not_public: tuple[str, ...]
    helper: tuple[str, ...]  # argv of the external ACL helper
    hosts_file: Path | None = None  # test-only: names resolved from this file first
    user: str | None = None  # cache_effective_user when started as root
    descriptors: int = 65536  # RLIMIT_NOFILE Squid is started with (egress_squid)


def squid_domains(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` without those a ``.domain`` entry covers: Squid refuses to start on them."""
    wider = [n for n in names if n.startswith(".")]
    return tuple(
        n for n in names if not any(w != n and matches(n.lstrip("."), (w,)) for w in wider)
    )


ACCESS_LOG: Final = "access.log"
# The client's port last: a kept-alive http connection logs each request while it
# stays open, and the live count must not add those bytes twice (egress_usage).
LOG_FORMAT: Final = "%ts.%03tu %>a %Ss/%03>Hs %<st %>st %rm %ru %>p"


def squid_conf(plan: SquidPlan) -> str:
    """The squid.conf of ``plan``: a forward proxy without a cache, refusing by default."""
    lines = [
        "# Written by sandbox-mcp (app/egress/rules.py); rewritten at each start.",
        f"http_port {plan.listen}",
        "pid_filename none",
        "cache deny all",
        "cache_mem 8 MB",
        "cache_store_log none",
        f"logformat smcp {LOG_FORMAT}",
        f"access_log stdio:{plan.workdir / ACCESS_LOG} smcp",
        f"cache_log {plan.workdir / 'cache.log'}",
        "logfile_rotate 0",
        "buffered_logs off",
        "visible_hostname sandbox-mcp-egress",
        "icp_port 0",
        "htcp_port 0",
        "snmp_port 0",
        "forwarded_for delete",
        "via off",
        "httpd_suppress_version_string on",
        "shutdown_lifetime 1 seconds",
        # Limits (README, "Egress"): a tunnel lives an hour at most, idles 5 minutes;
        # a connection that sends no request, or idles between requests, is closed
        # within 30 s (each holds one of the descriptors every tenant shares; the
        # firewall bounds how many one container holds, egress_connlimit).
        "client_lifetime 1 hour",
        "read_timeout 5 minutes",
        "request_start_timeout 30 seconds",
        "client_idle_pconn_timeout 30 seconds",
        "pconn_timeout 30 seconds",
        "connect_timeout 20 seconds",
        "request_header_max_size 64 KB",
        # The limit Squid is started with (it cannot raise its own once it is not root).
        f"max_filedescriptors {plan.descriptors}",
        "dns_retransmit_interval 2 seconds",
        "negative_dns_ttl 1 minute",
        "acl CONNECT method CONNECT",
        f"acl https_port port {HTTPS_PORT}",
        f"acl http_port port {HTTP_PORT}",
        "acl ceiling dstdomain " + " ".join(squid_domains(plan.ceiling) or ("invalid.",)),
        "acl not_public dst " + " ".join(plan.not_public),
        # The experiment's own list (a subset of the ceiling) and its byte cap.
        "external_acl_type smcp_experiment ttl=0 negative_ttl=0 children-max=4 "
        "children-startup=1 %SRC %DST " + " ".join(plan.helper),
        "acl experiment_allows external smcp_experiment",
        # Squid answers these itself, for every tenant at once: its cache manager
        # (cache_object://, /squid-internal-mgr/: other tenants' URLs and addresses),
        # its other internal pages, TRACE (an echo) and OPTIONS. Only the sites answer.
        "acl squid_internal urlpath_regex -i ^/squid-internal-",
        "acl cache_object proto cache_object",
        "acl self_answered method TRACE OPTIONS",
        "http_access deny manager",
        "http_access deny cache_object",
        "http_access deny squid_internal",
        "http_access deny self_answered",
        "cachemgr_passwd disable all",
        "http_access deny CONNECT !https_port",
        "http_access deny !CONNECT !http_port",
        "http_access deny !ceiling",
        "http_access deny !experiment_allows",
        "http_access deny not_public",
        "http_access allow all",
        "icp_access deny all",
        "htcp_access deny all",
    ]
    if plan.hosts_file is not None:
        lines.append(f"hosts_file {plan.hosts_file}")
    else:
        lines.append("hosts_file none")
    if plan.user is not None:
        lines.append(f"cache_effective_user {plan.user}")
    return "\n".join(lines) + "\n"
