"""Network "restricted": Squid, run by the server, as an experiment's only way out.

The layout, and why it is the simplest safe one:

* Restricted containers join one Docker network of this deployment, created
  ``--internal`` (Docker drops every packet that would leave its bridge) and without
  inter-container traffic (``enable_icc=false``: two experiments never reach each
  other). Nothing on it can route anywhere.
* Squid (Debian's package) runs on the host, listening only on that bridge's gateway
  address, one port. An ``--internal`` network still reaches the host itself (the
  INPUT chain, not FORWARD), so an iptables chain of ours, hooked on INPUT for that
  bridge, accepts only TCP to the proxy's address and port and drops the rest (and
  ip6tables drops everything: the bridge has IPv6 link-local addresses). A proxy
  container on two networks would need an image of its own and a network per
  experiment; this needs neither.
* Squid resolves names itself and applies :mod:`app.runtime.egress_rules`: the
  operator's ceiling, the experiment's own list (an external ACL helper reads it, by
  client address, from a state file we rewrite), no destination that is not public,
  443 for CONNECT (no TLS interception) and 80 for plain http.
* Squid's access log tells who was refused and who moved how many bytes: a client
  address is a container of one experiment (we map it when the container starts).
  Refusals are handed to that experiment's next command result; bytes are counted
  against its cap (then it is blocked) and in ``/metrics``.

The iptables chain stays when the server stops: experiment containers outlive a
restart, and must not reach the host meanwhile. It is removed with the network,
once no container is left on it. Squid is started with the server, stopped with it
(and killed with it: the parent-death signal), and its death is reported by
``/health``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import ipaddress
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import docker
import docker.errors
import structlog

from app.errors import ConfigurationError, InvalidArgument
from app.runtime import egress_acl_helper
from app.runtime.egress_rules import (
    ACCESS_LOG,
    HTTP_PORT,
    HTTPS_PORT,
    SquidPlan,
    clamp_allowlist,
    matches,
    not_public_ranges,
    squid_conf,
)

log = structlog.get_logger(__name__)

ALLOW_LABEL: Final = "egress-allow"  # <prefix>.egress-allow: the container's list
MAX_PENDING: Final = 20  # refusals kept per experiment until its next result
READY_TIMEOUT_S: Final = 20.0
POLL_S: Final = 1.0
SETTLE_S: Final = 0.5
_OPEN_STATES: Final = frozenset({"01", "08"})  # ESTABLISHED, CLOSE_WAIT (Squid's side)
SQUID_USER: Final = "proxy"  # Debian's squid user

# Why a request was refused (the metrics label) and what the agent is told.
REASONS: Final = {
    "not_allowed": "not on this experiment's allow-list",
    "not_public": "it resolves to an address that is not public (loopback, private, "
    "link-local or metadata, shared, or this server)",
    "port": "only https on port 443 and http on port 80 go through the proxy",
    "cap": "this experiment has used its egress byte cap",
}


@dataclass(frozen=True)
class EgressConfig:
    ceiling: tuple[str, ...]
    max_bytes: int  # per experiment
    deployment: str
    port: int = 3128
    squid: str = "squid"
    test_hosts: tuple[tuple[str, str], ...] = ()  # test-only: (name, address) for Squid
    label_prefix: str = "io.sandbox-mcp"

    @property
    def network(self) -> str:
        return f"sandbox-mcp-restricted-{self._tag}"

    @property
    def bridge(self) -> str:
        return f"smcpr-{self._tag}"  # an interface name: 15 characters at most

    @property
    def chain(self) -> str:
        return f"SMCP-EGRESS-{self._tag}"

    @property
    def _tag(self) -> str:
        return hashlib.sha256(self.deployment.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class RestrictedPlan:
    network: str
    env: dict[str, str]
    labels: dict[str, str]
    allowlist: tuple[str, ...]
    warnings: tuple[str, ...]


@dataclass
class _Client:
    """One container on the restricted network."""

    container_id: str
    address: str
    allow: tuple[str, ...]
    experiment_id: str = ""
    bytes: int = 0
    blocked: bool = False
    refusals: int = 0
    pending: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LogLine:
    client: str
    denied: bool
    bytes: int
    method: str
    host: str
    port: int

    @classmethod
    def parse(cls, line: str) -> LogLine | None:
        parts = line.split()
        if len(parts) < 7:
            return None
        _, client, status, out, into, method, url = parts[:7]
        try:
            size = max(0, int(out)) + max(0, int(into))
        except ValueError:
            return None
        host, port = _host_port(method, url)
        return cls(client, status.startswith("TCP_DENIED"), size, method, host, port)


def _host_port(method: str, url: str) -> tuple[str, int]:
    if method == "CONNECT":
        host, _, port = url.rpartition(":")
        return host.strip("[]"), int(port) if port.isdecimal() else HTTPS_PORT
    try:
        parts = urlsplit(url)
        return parts.hostname or "", parts.port or HTTP_PORT
    except ValueError:
        return url[:200], HTTP_PORT


class EgressProxy:
    """Squid for this deployment's restricted containers (see the module doc)."""

    def __init__(
        self,
        config: EgressConfig,
        *,
        client_factory: Callable[[], docker.DockerClient] = docker.from_env,
        on_refused: Callable[[str], None] = lambda reason: None,
        on_bytes: Callable[[int], None] = lambda size: None,
    ) -> None:
        self.config = config
        self._client_factory = client_factory
        self._on_refused = on_refused
        self._on_bytes = on_bytes
        self._clients: dict[str, _Client] = {}  # by container id
        self._by_address: dict[str, str] = {}  # container address -> container id
        self._gateway: str | None = None
        self._workdir: Path | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._offset = 0
        self._stopping = False
        self._read_lock = asyncio.Lock()

    # -- what experiments see ---------------------------------------------------------

    @property
    def network(self) -> str:
        return self.config.network

    @property
    def proxy_url(self) -> str:
        assert self._gateway is not None, "started"
        return f"http://{self._gateway}:{self.config.port}"

    def env(self) -> dict[str, str]:
        """The proxy settings the usual tools read (curl, pip, npm, git, cargo, go)."""
        url = self.proxy_url
        none = "localhost,127.0.0.1,::1"
        return {
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "NO_PROXY": none,
            "no_proxy": none,
            "PIP_PROXY": url,
            "npm_config_proxy": url,
            "npm_config_https_proxy": url,
            "CARGO_HTTP_PROXY": url,
        }

    def allow_label(self) -> str:
        return f"{self.config.label_prefix}.{ALLOW_LABEL}"

    def plan(self, asked: tuple[str, ...] | None) -> RestrictedPlan:
        """How to create a restricted container asking for ``asked`` (None: the ceiling).

        Raises:
            InvalidArgument: a name that is not a host name.
        """
        try:
            clamped = clamp_allowlist(asked, self.config.ceiling)
        except ValueError as exc:
            raise InvalidArgument(f"egress_allowlist: {exc}.", field="egress_allowlist") from None
        return RestrictedPlan(
            network=self.network,
            env=self.env(),
            labels={self.allow_label(): ",".join(clamped.names)},
            allowlist=clamped.names,
            warnings=(clamped.warning,) if clamped.warning else (),
        )

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Create the network and its firewall, start Squid, wait until it listens.

        Raises:
            ConfigurationError: not root, no squid, or Squid would not start.
        """
        if os.geteuid() != 0:
            raise ConfigurationError(
                "network 'restricted' needs the server to run as root on the Docker host "
                "(it sets iptables rules for the proxy); unset SANDBOX_MCP_EGRESS_PROXY."
            )
        squid = shutil.which(self.config.squid)
        if squid is None:
            raise ConfigurationError(
                f"network 'restricted' needs Squid ({self.config.squid} was not found): "
                "apt-get install squid, or unset SANDBOX_MCP_EGRESS_PROXY."
            )
        conf = await asyncio.to_thread(self._prepare)
        self._process = await asyncio.create_subprocess_exec(
            squid,
            "-N",
            "-f",
            str(conf),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        try:
            await self._wait_ready()
        except BaseException:
            self._process.kill()
            await self._process.wait()
            await asyncio.to_thread(self._cleanup)
            raise
        self._watcher = asyncio.create_task(self._watch(), name="egress-proxy-watch")
        log.info(
            "egress.started",
            proxy=self.proxy_url,
            network=self.network,
            pid=self._process.pid,
            allowlist=len(self.config.ceiling),
        )

    async def stop(self) -> None:
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        process = self._process
        if process is not None and process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
        await asyncio.to_thread(self._cleanup)
        log.info("egress.stopped")

    def health(self) -> dict[str, Any]:
        process = self._process
        if process is None or process.returncode is None:
            return {"ok": process is not None, "proxy": "squid"}
        return {
            "ok": False,
            "proxy": "squid",
            "reason": (
                f"the egress proxy (squid) exited with code {process.returncode}; "
                "experiments in network 'restricted' have no network until the server "
                "restarts"
            ),
        }

    # -- containers -------------------------------------------------------------------

    async def attach(self, api: docker.APIClient, container_id: str) -> None:
        """Map a started restricted container's address to it (its list is its label)."""
        info = await asyncio.to_thread(api.inspect_container, container_id)
        self._register(info)
        await asyncio.to_thread(self._write_state)

    async def detach(self, container_id: str) -> None:
        """Forget a removed container (after its last log lines are read)."""
        if container_id not in self._clients:
            return
        await self._read_log()
        client = self._clients.pop(container_id)
        if self._by_address.get(client.address) == container_id:
            del self._by_address[client.address]
        # Each experiment's egress, recorded once when its container goes.
        log.info(
            "egress.usage",
            experiment_id=client.experiment_id,
            container_id=container_id[:12],
            bytes=client.bytes,
            refused=client.refusals,
            capped=client.blocked,
        )
        await asyncio.to_thread(self._write_state)

    async def take_notice(self, container_id: str) -> str | None:
        """What the proxy refused this container since the last notice, for its result."""
        client = self._clients.get(container_id)
        if client is None:
            return None
        await self._settle(client.address)
        await self._read_log()
        if not client.pending:
            return None
        refused, client.pending = client.pending, []
        listed = ", ".join(client.allow) or "(nothing)"
        return (
            f"\n[sandbox-mcp] The egress proxy refused {len(refused)} connection(s) from "
            'this experiment (network "restricted"):\n'
            + "".join(f"  - {line}\n" for line in refused)
            + f"This experiment may reach: {listed}. A name on the server's allow-list "
            "(check_sandbox_runtime) can be asked for with egress_allowlist when the "
            "experiment is created; any other needs the operator "
            "(SANDBOX_MCP_EGRESS_ALLOWLIST). Addresses that are not public are never "
            "reached.\n"
        )

    async def _settle(self, address: str) -> None:
        """Wait (briefly) until Squid has closed this client's connections.

        Squid logs a connection when it ends, a moment after the command that made it
        exited; until then its last lines (the cap reached, a refusal) would miss this
        result. Bounded: a command left running in the background keeps its own.
        """
        assert self._gateway is not None
        deadline = time.monotonic() + SETTLE_S
        while await asyncio.to_thread(_open_connections, self._gateway, self.config.port, address):
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.01)

    def usage(self, container_id: str) -> tuple[int, int] | None:
        """(bytes, refusals) of a container so far."""
        client = self._clients.get(container_id)
        return None if client is None else (client.bytes, client.refusals)

    # -- internals --------------------------------------------------------------------

    def _prepare(self) -> Path:
        """The network, its firewall, Squid's folder and configuration (blocking)."""
        client = self._client_factory()
        try:
            api = client.api
            self._gateway = self._ensure_network(api)
            self._firewall(self._gateway)
            self._workdir = Path(tempfile.mkdtemp(prefix="sandbox-mcp-egress-"))
            logs = self._workdir / "log"
            logs.mkdir()
            self._workdir.chmod(0o755)
            user = SQUID_USER if _has_user(SQUID_USER) else None
            if user is not None:
                entry = pwd.getpwnam(user)
                os.chown(logs, entry.pw_uid, entry.pw_gid)
            helper = self._workdir / "acl_helper.py"
            shutil.copyfile(egress_acl_helper.__file__, helper)
            hosts = None
            if self.config.test_hosts:
                hosts = self._workdir / "hosts"
                hosts.write_text("".join(f"{a} {n}\n" for n, a in self.config.test_hosts))
            plan = SquidPlan(
                listen=f"{self._gateway}:{self.config.port}",
                workdir=logs,
                ceiling=self.config.ceiling,
                not_public=not_public_ranges(_host_addresses()),
                helper=(_system_python(), str(helper), str(self._workdir / "state.json")),
                hosts_file=hosts,
                user=user,
            )
            conf = self._workdir / "squid.conf"
            conf.write_text(squid_conf(plan))
            for found in self._network_containers(api):
                self._register(found)
            self._write_state()
            return conf
        finally:
            client.close()

    def _ensure_network(self, api: docker.APIClient) -> str:
        name = self.config.network
        found = [n for n in api.networks(names=[name]) if n.get("Name") == name]
        if not found:
            with contextlib.suppress(docker.errors.APIError):  # made meanwhile: inspected below
                api.create_network(
                    name,
                    driver="bridge",
                    internal=True,
                    options={
                        "com.docker.network.bridge.enable_icc": "false",
                        "com.docker.network.bridge.name": self.config.bridge,
                    },
                    labels={f"{self.config.label_prefix}.role": "egress-restricted"},
                )
        info = api.inspect_network(name)
        if not info.get("Internal"):
            raise ConfigurationError(f"The Docker network {name} exists but is not internal.")
        for pool in (info.get("IPAM") or {}).get("Config") or ():
            gateway = pool.get("Gateway")
            if gateway and ipaddress.ip_address(gateway).version == 4:
                return str(gateway)
        raise ConfigurationError(f"The Docker network {name} has no IPv4 gateway.")

    def _firewall(self, gateway: str) -> None:
        """INPUT from the bridge: only TCP to the proxy; nothing over IPv6."""
        chain, bridge = self.config.chain, self.config.bridge
        rules = {
            "iptables": [
                ["-p", "tcp", "-d", gateway, "--dport", str(self.config.port), "-j", "ACCEPT"],
                ["-j", "DROP"],
            ],
            "ip6tables": [["-j", "DROP"]],
        }
        for tool, body in rules.items():
            if shutil.which(tool) is None:
                raise ConfigurationError(f"network 'restricted' needs {tool}.")
            _iptables(tool, "-N", chain, check=False)
            _iptables(tool, "-F", chain)
            for rule in body:
                _iptables(tool, "-A", chain, *rule)
            for hook in _hooks(tool, bridge, chain):
                if _iptables(tool, "-C", *hook, check=False) != 0:
                    _iptables(tool, "-I", *hook)

    def _cleanup(self) -> None:
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        client = self._client_factory()
        try:
            info = client.api.inspect_network(self.config.network)
            if info.get("Containers"):
                return  # its containers outlive the server: keep their firewall
            client.api.remove_network(self.config.network)
        except docker.errors.DockerException:
            return
        finally:
            client.close()
        for tool in ("iptables", "ip6tables"):
            for hook in _hooks(tool, self.config.bridge, self.config.chain):
                _iptables(tool, "-D", *hook, check=False)
            _iptables(tool, "-F", self.config.chain, check=False)
            _iptables(tool, "-X", self.config.chain, check=False)

    def _network_containers(self, api: docker.APIClient) -> list[dict[str, Any]]:
        info = api.inspect_network(self.config.network)
        found = []
        for container_id in info.get("Containers") or {}:
            with contextlib.suppress(docker.errors.NotFound):
                found.append(api.inspect_container(container_id))
        return found

    def _register(self, info: dict[str, Any]) -> None:
        container_id = str(info["Id"])
        networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
        address = (networks.get(self.network) or {}).get("IPAddress")
        if not address:
            return
        labels = (info.get("Config") or {}).get("Labels") or {}
        label = labels.get(self.allow_label(), "")
        experiment_id = labels.get(f"{self.config.label_prefix}.experiment", "")
        allow = tuple(
            n for n in label.split(",") if n and matches(n.lstrip("."), self.config.ceiling)
        )
        previous = self._by_address.get(address)
        if previous is not None and previous != container_id:
            self._clients.pop(previous, None)
        self._clients[container_id] = _Client(container_id, address, allow, experiment_id)
        self._by_address[address] = container_id

    def _write_state(self) -> None:
        if self._workdir is None:
            return
        state = {
            c.address: {"allow": list(c.allow), "blocked": c.blocked}
            for c in self._clients.values()
        }
        target = self._workdir / "state.json"
        scratch = target.with_suffix(".tmp")
        scratch.write_text(json.dumps(state))
        scratch.chmod(0o644)
        scratch.replace(target)

    async def _wait_ready(self) -> None:
        assert self._process is not None
        assert self._gateway is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.returncode is not None:
                raise ConfigurationError(
                    f"Squid exited at start ({self._process.returncode}): {self._squid_log()}"
                )
            try:
                _, writer = await asyncio.open_connection(self._gateway, self.config.port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.05)
        raise ConfigurationError(
            f"Squid did not listen in {READY_TIMEOUT_S:g} s: {self._squid_log()}"
        )

    def _squid_log(self) -> str:
        if self._workdir is None:
            return ""
        with contextlib.suppress(OSError):
            return (self._workdir / "log" / "cache.log").read_text(errors="replace")[-1500:]
        return ""

    async def _watch(self) -> None:
        """Count bytes and refusals as they come; say once when Squid died."""
        assert self._process is not None
        while True:
            await asyncio.sleep(POLL_S)
            if self._process.returncode is not None and not self._stopping:
                log.error("egress.proxy_died", code=self._process.returncode, log=self._squid_log())
                return
            try:
                await self._read_log()
            except Exception:
                log.exception("egress.log_failed")

    async def _read_log(self) -> None:
        if self._workdir is None:
            return
        async with self._read_lock:
            lines, self._offset = await asyncio.to_thread(
                _read_new_lines, self._workdir / "log" / ACCESS_LOG, self._offset
            )
            changed = False
            for text in lines:
                line = LogLine.parse(text)
                if line is not None:
                    changed |= self._account(line)
            if changed:
                await asyncio.to_thread(self._write_state)

    def _account(self, line: LogLine) -> bool:
        """Add one log line to its container; whether the state file must change."""
        container_id = self._by_address.get(line.client)
        client = self._clients.get(container_id) if container_id else None
        if client is None:
            return False
        client.bytes += line.bytes
        self._on_bytes(line.bytes)
        if line.denied:
            reason = self._reason(client, line)
            client.refusals += 1
            self._on_refused(reason)
            log.info(
                "egress.refused",
                experiment_id=client.experiment_id,
                container_id=client.container_id[:12],
                host=line.host,
                port=line.port,
                reason=reason,
            )
            if len(client.pending) < MAX_PENDING:
                client.pending.append(f"{line.host}:{line.port}: {REASONS[reason]}")
        if not client.blocked and client.bytes >= self.config.max_bytes:
            client.blocked = True
            log.warning(
                "egress.cap_reached",
                experiment_id=client.experiment_id,
                container_id=client.container_id[:12],
                bytes=client.bytes,
            )
            client.pending.append(
                f"the egress byte cap ({self.config.max_bytes:,} bytes) is used up: "
                "the proxy refuses this experiment's further connections"
            )
            return True
        return False

    def _reason(self, client: _Client, line: LogLine) -> str:
        wanted = HTTPS_PORT if line.method == "CONNECT" else HTTP_PORT
        if line.port != wanted:
            return "port"
        if client.blocked:
            return "cap"
        if not matches(line.host, client.allow):
            return "not_allowed"
        return "not_public"


def _read_new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    try:
        with path.open("rb") as file:
            file.seek(offset)
            data = file.read(4 * 1024 * 1024)
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
    return data[:end].decode(errors="replace").splitlines(), offset + end


def _hooks(tool: str, bridge: str, chain: str) -> list[list[str]]:
    """Where our chain is hooked: INPUT from the bridge; for IPv6 forwarding too (Docker
    filters IPv4 between containers, and no IPv6 at all on a network without it)."""
    chains = ["INPUT", "FORWARD"] if tool == "ip6tables" else ["INPUT"]
    return [[name, "-i", bridge, "-j", chain] for name in chains]


def _open_connections(gateway: str, port: int, client: str) -> bool:
    """Whether Squid still holds a connection from ``client`` (``/proc/net/tcp``)."""
    local = f"{_hex_address(gateway)}:{port:04X}"
    remote = _hex_address(client) + ":"
    try:
        with open("/proc/net/tcp", encoding="ascii") as table:
            next(table, None)
            for row in table:
                fields = row.split()
                if (
                    fields[1] == local
                    and fields[2].startswith(remote)
                    and fields[3] in _OPEN_STATES
                ):
                    return True
    except OSError:
        return False
    return False


def _hex_address(address: str) -> str:
    return ipaddress.IPv4Address(address).packed[::-1].hex().upper()


def _iptables(tool: str, *args: str, check: bool = True) -> int:
    done = subprocess.run([tool, "-w", *args], capture_output=True, text=True, check=False)  # noqa: S603
    if check and done.returncode != 0:
        raise ConfigurationError(f"{tool} {' '.join(args)} failed: {done.stderr.strip()}")
    return done.returncode


def _host_addresses() -> list[str]:
    """Every address of this host's interfaces (``ip -j addr``)."""
    try:
        done = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True)  # noqa: S607
        return [a["local"] for i in json.loads(done.stdout) for a in i.get("addr_info", ())]
    except (OSError, subprocess.CalledProcessError, ValueError, KeyError):
        return [socket.gethostbyname(socket.gethostname())]


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _system_python() -> str:
    # Squid's user must be able to run it: not a virtualenv in root's home.
    return shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the server dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
