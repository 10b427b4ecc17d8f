"""The restricted network: an internal Docker network and the firewall on its bridge.

Blocking functions (Docker SDK, iptables): the proxy calls them in a thread.

* The network is ``--internal`` (Docker drops every packet that would leave its
  bridge) with inter-container traffic off (``enable_icc=false``), and its bridge
  has a fixed name, so the firewall can name it.
* An internal network still reaches the host itself (the INPUT chain, not FORWARD).
  Our chain, hooked on INPUT for that bridge, accepts only TCP to the proxy's
  address and port and drops the rest; a new connection from an address that holds
  ``MAX_CONNECTIONS`` to the proxy already is reset (:mod:`app.egress.connlimit`:
  the shared Squid's descriptors are not one tenant's to take); ip6tables drops
  everything from the bridge, forwarded too (Docker gives these containers no IPv6:
  defence in depth).
* Both outlive the server (its containers outlive a restart and must not reach the
  host meanwhile); they go once no container is left on the network.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import shutil
import socket
import subprocess

import docker
import docker.errors

from app.egress.connlimit import limit_rule
from app.errors import ConfigurationError

_TOOLS = ("iptables", "ip6tables")


def ensure_network(api: docker.APIClient, name: str, bridge: str, labels: dict[str, str]) -> str:
    """Create the network unless it exists; its IPv4 gateway address.

    Raises:
        ConfigurationError: a network of that name that is not internal, or has no gateway.
    """
    found = [n for n in api.networks(names=[name]) if n.get("Name") == name]
    if not found:
        with contextlib.suppress(docker.errors.APIError):  # made meanwhile: inspected below
            api.create_network(
                name,
                driver="bridge",
                internal=True,
                options={
                    "com.docker.network.bridge.enable_icc": "false",
                    "com.docker.network.bridge.name": bridge,
                },
                labels=labels,
            )
    info = api.inspect_network(name)
    if not info.get("Internal"):
        raise ConfigurationError(f"The Docker network {name} exists but is not internal.")
    for pool in (info.get("IPAM") or {}).get("Config") or ():
        gateway = pool.get("Gateway")
        if gateway and ipaddress.ip_address(gateway).version == 4:
            return str(gateway)
    raise ConfigurationError(f"The Docker network {name} has no IPv4 gateway.")


def install_firewall(bridge: str, chain: str, gateway: str, port: int) -> None:
    """From the bridge to the host: only TCP to ``gateway:port``, ``MAX_CONNECTIONS``
    open at once per address (refusals noted in the ``xt_recent`` list named as
    ``chain``); no IPv6 at all.

    Raises:
        ConfigurationError: iptables or ip6tables is missing or refuses a rule.
    """
    rules = {
        "iptables": [
            limit_rule(gateway, port, chain),
            ["-p", "tcp", "-d", gateway, "--dport", str(port), "-j", "ACCEPT"],
            ["-j", "DROP"],
        ],
        "ip6tables": [["-j", "DROP"]],
    }
    for tool, body in rules.items():
        if shutil.which(tool) is None or shutil.which(f"{tool}-restore") is None:
            raise ConfigurationError(f"network 'restricted' needs {tool} and {tool}-restore.")
        _replace_chain(tool, chain, body)
        for hook in _hooks(tool, bridge, chain):
            if _iptables(tool, "-C", *hook, check=False) != 0:
                _iptables(tool, "-I", *hook)


def remove_if_unused(api: docker.APIClient, name: str, bridge: str, chain: str) -> bool:
    """Remove the network and its firewall unless a container is still on it."""
    try:
        if api.inspect_network(name).get("Containers"):
            return False  # its containers outlive the server: keep their firewall
        api.remove_network(name)
    except docker.errors.DockerException:
        return False
    for tool in _TOOLS:
        for hook in _hooks(tool, bridge, chain):
            _iptables(tool, "-D", *hook, check=False)
        _iptables(tool, "-F", chain, check=False)
        _iptables(tool, "-X", chain, check=False)
    return True


def host_addresses() -> list[str]:
    """Every address of this host's interfaces (``ip -j addr``)."""
    try:
        done = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True)  # noqa: S607
        return [a["local"] for i in json.loads(done.stdout) for a in i.get("addr_info", ())]
    except (OSError, subprocess.CalledProcessError, ValueError, KeyError):
        return [socket.gethostbyname(socket.gethostname())]


def _hooks(tool: str, bridge: str, chain: str) -> list[list[str]]:
    chains = ["INPUT", "FORWARD"] if tool == "ip6tables" else ["INPUT"]
    return [[name, "-i", bridge, "-j", chain] for name in chains]


def _replace_chain(tool: str, chain: str, body: list[list[str]]) -> None:
    """Create or refill ``chain`` with ``body`` in one commit of the filter table.

    Not ``-F`` then ``-A``: every server process start (each worker of ``serve
    --workers``, each restart) refills the chain while its hook stays in INPUT, and
    between the flush and the last rule a restricted container's packets would fall
    through to the host's own rules (ACCEPT by default). ``*-restore --noflush``
    swaps the chain's rules at once and leaves the rest of the table alone."""
    rules = [" ".join(["-A", chain, *rule]) for rule in body]
    script = "\n".join(["*filter", f":{chain} - [0:0]", *rules, "COMMIT", ""])
    done = subprocess.run(  # noqa: S603
        [f"{tool}-restore", "-w", "--noflush"],
        input=script,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ConfigurationError(f"{tool}-restore of chain {chain} failed: {done.stderr.strip()}")


def _iptables(tool: str, *args: str, check: bool = True) -> int:
    done = subprocess.run([tool, "-w", *args], capture_output=True, text=True, check=False)  # noqa: S603
    if check and done.returncode != 0:
        raise ConfigurationError(f"{tool} {' '.join(args)} failed: {done.stderr.strip()}")
    return done.returncode
