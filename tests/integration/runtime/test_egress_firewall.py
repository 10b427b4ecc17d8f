"""The restricted network's firewall is replaced at once, never left half-filled.

Every server process start refills the chain while its hook stays in INPUT (each
worker of ``serve --workers``, each restart); a chain flushed and then refilled rule
by rule lets a restricted container's packets through to the host's own rules
(ACCEPT by default) in between. Here, in a network namespace of the test's own, the
chain is installed again and again while another process keeps listing it: it must
never be seen without its final DROP (nor without the per-address connection limit
before its ACCEPT).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.integration

CHAIN = "SMCP-TEST-FW"
REINSTALLS = 150
LISTINGS = 25  # the watcher's looks the installs go on for, however slow it is


@pytest.fixture
def namespace() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.fail("iptables in a network namespace needs root (CI runs as root)")
    name = f"smcp-fw-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def in_namespace(name: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", name, *argv]


def installs_of(count: int, until: str | None = None) -> str:
    """A Python program that installs the firewall ``count`` times, as server starts do,
    and then on until the file ``until`` exists (at most 200 s): a fixed count alone
    could end before a slow watcher had looked often enough."""
    return (
        "import os, time\n"
        "from app.egress.network import install_firewall\n"
        "deadline, done = time.monotonic() + 200, 0\n"
        f"while done < {count} or ({until!r} and not os.path.exists({until!r})"
        " and time.monotonic() < deadline):\n"
        f"    install_firewall('br-smcp-test', '{CHAIN}', '10.99.0.1', 3128)\n"
        "    done += 1\n"
    )


def test_reinstalling_the_firewall_never_shows_a_half_filled_chain(namespace: str) -> None:
    first = subprocess.run(
        in_namespace(namespace, sys.executable, "-c", installs_of(1)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert first.returncode == 0, first.stderr
    # Watch the chain from a second process while the installs run; once it has looked
    # LISTINGS times it says so, and the installs (at least REINSTALLS) stop.
    enough = f"/tmp/{namespace}.enough"
    watch = (
        f"n=0; while [ ! -e /tmp/{namespace}.done ]; do iptables -w -S {CHAIN}; echo ---; "
        f"n=$((n+1)); [ $n -ge {LISTINGS} ] && touch {enough}; done"
    )
    watcher = subprocess.Popen(
        in_namespace(namespace, "sh", "-c", watch),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        installs = subprocess.run(
            in_namespace(namespace, sys.executable, "-c", installs_of(REINSTALLS, enough)),
            capture_output=True,
            text=True,
            check=False,
            timeout=240,
        )
    finally:
        open(f"/tmp/{namespace}.done", "w").close()
        out, _ = watcher.communicate(timeout=60)
        os.unlink(f"/tmp/{namespace}.done")
        if os.path.exists(enough):
            os.unlink(enough)
    assert installs.returncode == 0, installs.stderr
    listings = [block.strip().splitlines() for block in out.split("---") if block.strip()]
    assert len(listings) >= LISTINGS, "the watcher must have looked while the installs ran"
    whole = [
        f"-N {CHAIN}",
        f"-A {CHAIN} -d 10.99.0.1/32 -p tcp -m tcp --dport 3128 --tcp-flags FIN,SYN,RST,ACK SYN "
        "-m connlimit --connlimit-above 64 --connlimit-mask 32 --connlimit-saddr "
        f"-m recent --set --name {CHAIN} --mask 255.255.255.255 --rsource "
        "-j REJECT --reject-with tcp-reset",
        f"-A {CHAIN} -d 10.99.0.1/32 -p tcp -m tcp --dport 3128 -j ACCEPT",
        f"-A {CHAIN} -j DROP",
    ]
    assert [listing for listing in listings if listing != whole] == []
    hooks = subprocess.run(
        in_namespace(namespace, "iptables", "-w", "-S", "INPUT"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert hooks.count(f"-j {CHAIN}") == 1, hooks
