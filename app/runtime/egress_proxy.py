"""Network "restricted": Squid, run by the server, as an experiment's only way out.

The layout, and why it is the simplest safe one:

* Restricted containers join one Docker network of this deployment, created
  ``--internal`` (Docker drops every packet that would leave its bridge) and without
  inter-container traffic (``enable_icc=false``: two experiments never reach each
  other). Nothing on it can route anywhere.
* Squid (Debian's package) runs on the host, listening only on that bridge's gateway
  address, one port. An ``--internal`` network still reaches the host itself (the
  INPUT chain, not FORWARD), so an iptables chain of ours, hooked on INPUT for that
  bridge, accepts only TCP to the proxy's address and port and drops the rest, and
  ip6tables drops everything (:mod:`app.runtime.egress_network`). A proxy container
  on two networks would need an image of its own and a network per experiment; this
  needs neither.
* Squid resolves names itself and applies :mod:`app.runtime.egress_rules`: the
  operator's ceiling, the experiment's own list (an external ACL helper reads it, by
  client address, from a state file we rewrite), no destination that is not public,
  443 for CONNECT (no TLS interception) and 80 for plain http.
* Squid's access log tells who was refused and who moved how many bytes
  (:mod:`app.runtime.egress_usage`): a client address is a container of one
  experiment (mapped when the container starts). Refusals are handed to that
  experiment's next command result; bytes are counted against its cap (then it is
  blocked) and in ``/metrics``.

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
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import docker
import structlog

from app.errors import ConfigurationError, InvalidArgument
from app.runtime import egress_acl_helper
from app.runtime.egress_network import (
    ensure_network,
    host_addresses,
    install_firewall,
    network_containers,
    remove_if_unused,
)
from app.runtime.egress_rules import (
    ACCESS_LOG,
    SquidPlan,
    clamp_allowlist,
    matches,
    not_public_ranges,
    squid_conf,
)
from app.runtime.egress_usage import Client, Ledger, LogLine, open_connections, read_new_lines

log = structlog.get_logger(__name__)

ALLOW_LABEL: Final = "egress-allow"  # <prefix>.egress-allow: the container's list
READY_TIMEOUT_S: Final = 20.0
POLL_S: Final = 1.0
SETTLE_S: Final = 0.5
SQUID_USER: Final = "proxy"  # Debian's squid user


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
        self._ledger = Ledger(config.max_bytes, on_refused=on_refused, on_bytes=on_bytes)
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
        if self._ledger.get(container_id) is None:
            return
        await self._read_log()
        client = self._ledger.remove(container_id)
        assert client is not None
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
        client = self._ledger.get(container_id)
        if client is None:
            return None
        await self._settle(client.address)
        await self._read_log()
        return self._ledger.notice(container_id)

    async def _settle(self, address: str) -> None:
        """Wait (briefly) until Squid has closed this client's connections.

        Squid logs a connection when it ends, a moment after the command that made it
        exited; until then its last lines (the cap reached, a refusal) would miss this
        result. Bounded: a command left running in the background keeps its own.
        """
        assert self._gateway is not None
        deadline = time.monotonic() + SETTLE_S
        while await asyncio.to_thread(open_connections, self._gateway, self.config.port, address):
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.01)

    def usage(self, container_id: str) -> tuple[int, int] | None:
        """(bytes, refusals) of a container so far."""
        client = self._ledger.get(container_id)
        return None if client is None else (client.bytes, client.refusals)

    # -- internals --------------------------------------------------------------------

    def _prepare(self) -> Path:
        """The network, its firewall, Squid's folder and configuration (blocking)."""
        client = self._client_factory()
        try:
            api, config = client.api, self.config
            labels = {f"{config.label_prefix}.role": "egress-restricted"}
            self._gateway = ensure_network(api, config.network, config.bridge, labels)
            install_firewall(config.bridge, config.chain, self._gateway, config.port)
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
                not_public=not_public_ranges(host_addresses()),
                helper=(_system_python(), str(helper), str(self._workdir / "state.json")),
                hosts_file=hosts,
                user=user,
            )
            conf = self._workdir / "squid.conf"
            conf.write_text(squid_conf(plan))
            for found in network_containers(api, config.network):
                self._register(found)
            self._write_state()
            return conf
        finally:
            client.close()

    def _cleanup(self) -> None:
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        client = self._client_factory()
        try:
            config = self.config
            remove_if_unused(client.api, config.network, config.bridge, config.chain)
        finally:
            client.close()

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
        self._ledger.add(Client(container_id, address, allow, experiment_id))

    def _write_state(self) -> None:
        if self._workdir is None:
            return
        state = self._ledger.state()
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
                read_new_lines, self._workdir / "log" / ACCESS_LOG, self._offset
            )
            changed = False
            for text in lines:
                line = LogLine.parse(text)
                if line is not None:
                    changed |= self._ledger.account(line)
            if changed:
                await asyncio.to_thread(self._write_state)


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
