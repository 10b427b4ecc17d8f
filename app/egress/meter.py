"""The per-experiment egress byte cap and the proxy's refusals, kept in the database and
shared by every server process.

* **One truth for the ACL helper.** Its state file (client address -> the
  container's experiment, allow-list, and whether the cap stopped it) is written
  whole from what is true at that moment: the containers Docker has on the
  restricted network (one call, their labels and addresses) and the caps the
  database holds. Any process writes it (a container it started or removed, an
  experiment it stopped), always under the folder's lock, so no stale view ever
  replaces a newer one and no process needs to know another's containers.
* **Durable, counted once.** Squid's access log is counted by one process at a time
  (the folder's lock), from the offset kept beside it (``meter.json``): the one that
  runs Squid every poll (:data:`POLL_S`), any other when it needs the lines at once
  (a command's result, a container removed). The bytes and refusals go to the
  experiment's row and the notices to ``egress_notices`` in one transaction
  (:class:`app.storage.egress_store.SqlUsageRecords`), then the offset moves; a
  database that refuses leaves the offset, and the lines are counted next time.
  A process killed between the commit and the offset's write counts one read
  twice (an earlier cap, never a later one).
* **The log does not pile up** (it is in /run): it is moved aside and reopened
  once its counted part is past ``rotate_bytes`` (:mod:`app.egress.log`).
* **The connection limits** (:mod:`app.egress.connlimit`, per container;
  :mod:`app.egress.bounds`, per sandbox and per sign-in address): the
  addresses the firewall refused since the last read are counted as one refusal
  each, told like Squid's. The bounds' maps (address -> sandbox, sign-in address)
  are written with the ACL state, from the same scan.
* **The sandbox's daily budget.** Each line's bytes also count against its
  container's sandbox (by its label) for the day (UTC), in the same transaction;
  once ``day_bytes`` is reached every container of the sandbox is blocked and cut,
  told once (``EGRESS_BUDGET_REACHED``), whichever experiment moved the bytes, until
  the day ends. New experiments do not reset it, nor do deleted ones.
* **During a transfer.** Every poll the process running Squid adds the bytes of the
  connections still open (the kernel's count, :mod:`app.egress.sockets`) to
  the recorded total; once the cap is reached the experiment is recorded capped,
  blocked in the state file, its open connections are cut (``ss -K``) and its next
  command result says so (``EGRESS_CAP_REACHED``), whichever process runs it.
* **The residual overrun** is what the experiment moves between two polls (one
  second of its transfers) and what the socket buffers held when it was cut; a
  kill -9 of the process running Squid loses no line of the log (the next process
  elected stops that Squid first, which logs the connections it still held, then
  counts the last lines), but nothing cuts a transfer at the cap until it is
  elected (a second or two).

The log is read and parsed in a thread (a big log never holds the event loop).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Protocol

import structlog

from app.egress.bounds import Bounds, write_maps
from app.egress.log import read_since, rotate
from app.egress.records import Notice, Usage
from app.egress.sockets import cut, live_bytes, open_connections
from app.egress.squid import FolderLock, SquidFolder
from app.egress.usage import (
    MAX_PENDING,
    ProxyClient,
    clients_of,
    notice_text,
    open_bytes,
)
from app.errors import ConfigurationError, DatabaseUnavailable

log = structlog.get_logger(__name__)

POLL_S: Final = 1.0
ROTATE_BYTES: Final = 4 * 1024**2  # of counted log, then it is moved aside (in /run: memory)
SETTLE_S: Final = 0.5


class UsageRecords(Protocol):
    """Where each experiment's bytes and notices are kept (``SqlUsageRecords``)."""

    async def record(
        self,
        moved: Mapping[str, int],
        refused: Mapping[str, int] | None = None,
        notices: Sequence[Notice] = (),
        *,
        max_pending: int = MAX_PENDING,
        sandboxes: Mapping[str, int] | None = None,
    ) -> dict[str, Usage]: ...
    async def mark_capped(self, experiment_id: str, containers: Iterable[str] = ()) -> bool: ...
    async def sandbox_days(self, sandboxes: Iterable[str]) -> dict[str, int]: ...
    async def mark_budget_spent(self, sandbox: str, containers: Iterable[str] = ()) -> bool: ...
    async def load(self, experiment_ids: Iterable[str]) -> dict[str, Usage]: ...
    async def take_notices(self, container_id: str) -> list[Notice]: ...


class EgressMeter:
    """Counts the shared Squid log into ``records`` and keeps the ACL state true."""

    def __init__(
        self,
        folder: SquidFolder,
        records: UsageRecords,
        *,
        max_bytes: int,
        scan: Callable[[], list[ProxyClient]],
        on_refused: Callable[[str], None] = lambda reason: None,
        on_bytes: Callable[[int], None] = lambda size: None,
        rotate_bytes: int = ROTATE_BYTES,
        limit_list: str = "",
        bounds: tuple[str, Bounds] | None = None,
        day_bytes: int | None = None,
    ) -> None:
        self.folder = folder
        self.rotate_bytes = rotate_bytes
        self.limit_list = limit_list  # the firewall's xt_recent list (egress_connlimit)
        self.bounds = bounds  # egress_bounds' table and its bounds (None: not bounded)
        self.lock = FolderLock(folder.lock)
        self.max_bytes = max_bytes
        self.day_bytes = day_bytes  # per sandbox and day (None: no budget)
        self._records = records
        self.proxy = ("", 0)  # Squid's gateway:port, once the network is made
        self._scan = scan  # blocking: the containers Docker has on the network
        self._on_refused = on_refused
        self._on_bytes = on_bytes
        self._cache: tuple[tuple[int, int], dict[str, ProxyClient]] | None = None

    # -- the ACL helper's state -------------------------------------------------------

    def clients(self) -> dict[str, ProxyClient]:
        """The state file's clients by address (read again only when it changed)."""
        try:
            info = os.stat(self.folder.state)
        except OSError:
            return {}
        stamp = (info.st_mtime_ns, info.st_ino)
        if self._cache is None or self._cache[0] != stamp:
            self._cache = (stamp, clients_of(self.folder.read_state()))
        return self._cache[1]

    def client(self, container_id: str) -> ProxyClient | None:
        return next((c for c in self.clients().values() if c.container_id == container_id), None)

    async def refresh_state(self) -> None:
        """Write the state from Docker and the database (a container came or went)."""
        async with self.lock:
            await self.write_state()

    async def write_state(
        self, also_blocked: Iterable[str] = (), also_spent: Iterable[str] = ()
    ) -> None:
        """The state file, whole, from what is true now (``also_``: experiments capped,
        sandboxes whose budget is spent, just now). Caller holds :attr:`lock`."""
        found = await asyncio.to_thread(self._scan)
        experiments = {c.experiment_id for c in found if c.experiment_id}
        try:
            usage = await self._records.load(experiments)
            blocked = {e for e, u in usage.items() if u.capped or u.bytes >= self.max_bytes}
            spent = await self._spent({c.sandbox: 0 for c in found if c.sandbox})
        except DatabaseUnavailable as exc:  # keep who was blocked: never unblock on a guess
            log.warning("egress.record_failed", reason=str(exc))
            blocked = {c.experiment_id for c in self.clients().values() if c.blocked}
            spent = {c.sandbox for c in self.clients().values() if c.blocked and c.sandbox}
        blocked |= set(also_blocked)
        spent |= set(also_spent)
        state = {
            c.address: dataclasses.replace(
                c, blocked=c.experiment_id in blocked or c.sandbox in spent
            ).entry()
            for c in found
        }
        await asyncio.to_thread(self.folder.write_state, state)
        if self.bounds is not None:
            try:
                await asyncio.to_thread(write_maps, self.bounds[0], found)
            except ConfigurationError as exc:  # the per-container limit still holds
                log.error("egress.bounds_failed", reason=str(exc))

    # -- the log ----------------------------------------------------------------------

    async def read_log(self) -> None:
        """Count the log's new lines, record them, stop who reached the cap."""
        async with self.lock:
            await self.read_log_locked()

    async def read_log_locked(self) -> None:
        position = self.folder.read_json(self.folder.meter)
        offset = int(position.get("offset") or 0)
        aside = position.get("aside")  # how far the log moved aside was counted
        logged: dict[str, int] = dict(position.get("logged") or {})
        clients = self.clients()
        read = await asyncio.to_thread(
            read_since,
            self.folder,
            offset,
            aside if isinstance(aside, int) else None,
            clients,
            self.limit_list,
            self.proxy,
            self.bounds,
        )
        done = read.done
        if read.end == offset and aside is None and not read.limited:
            if offset >= self.rotate_bytes:  # counted at an earlier read
                await asyncio.to_thread(rotate, self.folder, offset, logged)
            return
        notices = [
            Notice(r.client.container_id, r.client.experiment_id, "refused", r.text)
            for r in done.refusals
        ]
        try:
            totals = await self._records.record(
                done.moved, done.refused, notices, max_pending=MAX_PENDING, sandboxes=done.sandboxes
            )
        except DatabaseUnavailable as exc:
            # The offsets stay: these lines are counted at the next read, not lost.
            log.warning("egress.record_failed", reason=str(exc))
            return
        for connection, size in done.by_connection.items():
            logged[connection] = logged.get(connection, 0) + size
        moved: dict[str, Any] = {"offset": read.end, "logged": logged}
        if read.aside_end is not None and not read.aside_complete:
            moved["aside"] = read.aside_end
        await asyncio.to_thread(self.folder.write_json, self.folder.meter, moved)
        if read.aside_complete:
            await asyncio.to_thread(self.folder.rotated_log.unlink, missing_ok=True)
        if "aside" not in moved and read.end >= self.rotate_bytes:
            await asyncio.to_thread(rotate, self.folder, read.end, logged)
        self._on_bytes(done.bytes)
        for reason in done.reasons:
            self._on_refused(reason)
        for refusal in done.refusals:
            log.info(
                "egress.refused",
                experiment_id=refusal.client.experiment_id,
                container_id=refusal.client.container_id[:12],
                host=refusal.line.host,
                port=refusal.line.port,
                reason=refusal.reason,
            )
        over = {e for e, u in totals.items() if u.bytes >= self.max_bytes and not u.capped}
        await self._stop(over, clients, totals)
        try:
            spent = await self._spent(dict.fromkeys(done.sandboxes, 0))  # recorded just now
        except DatabaseUnavailable as exc:  # the next read stops them
            log.warning("egress.record_failed", reason=str(exc))
            return
        await self._stop_sandboxes(spent, self.clients())

    async def restart_log(self) -> None:
        """Before a new Squid writes the log: the last one's lines counted (the log
        moved aside too), the log emptied. Caller holds :attr:`lock`, and no Squid
        runs on the folder."""
        await self.read_log_locked()
        await asyncio.to_thread(self.folder.truncate_log)
        await asyncio.to_thread(
            self.folder.write_json, self.folder.meter, {"offset": 0, "logged": {}}
        )

    # -- the cap during a transfer ------------------------------------------------------

    async def check_live(self) -> None:
        """Stop who reaches the cap with the connections still open (the process
        running Squid, every poll)."""
        async with self.lock:
            gateway, port = self.proxy
            live = await asyncio.to_thread(live_bytes, gateway, port)
            position = self.folder.read_json(self.folder.meter)
            logged: dict[str, int] = dict(position.get("logged") or {})
            if logged.keys() - live.keys():  # closed: their whole count is the log's now
                logged = {k: v for k, v in logged.items() if k in live}
                position["logged"] = logged
                await asyncio.to_thread(self.folder.write_json, self.folder.meter, position)
            if not live:
                return
            clients = self.clients()
            opened = open_bytes(live, logged, clients)
            try:
                usage = await self._records.load(opened)
            except DatabaseUnavailable as exc:
                log.warning("egress.record_failed", reason=str(exc))
                return
            over = set()
            for experiment_id, size in opened.items():
                recorded = usage.get(experiment_id, Usage(0, False))
                if not recorded.capped and recorded.bytes + size >= self.max_bytes:
                    over.add(experiment_id)
            await self._stop(over, clients, {e: u.bytes + opened[e] for e, u in usage.items()})
            by_sandbox = open_bytes(live, logged, clients, by=lambda client: client.sandbox)
            try:
                spent = await self._spent(by_sandbox)
            except DatabaseUnavailable as exc:
                log.warning("egress.record_failed", reason=str(exc))
                return
            await self._stop_sandboxes(spent, self.clients())

    async def _spent(self, sandboxes: Mapping[str, int]) -> set[str]:
        """Those of ``sandboxes`` whose day reaches the budget with the bytes given
        (still open ones, not recorded yet; 0: only what is recorded).

        Raises:
            DatabaseUnavailable: the day's counts cannot be read.
        """
        if self.day_bytes is None or not sandboxes:
            return set()
        days = await self._records.sandbox_days(sandboxes)
        return {s for s, size in sandboxes.items() if days.get(s, 0) + size >= self.day_bytes}

    async def _stop_sandboxes(
        self, sandboxes: set[str], clients: Mapping[str, ProxyClient]
    ) -> None:
        """Block and cut every container of these sandboxes whose budget is spent (the
        ones not blocked yet), each told once. Caller holds :attr:`lock`."""
        sandboxes = {
            s for s in sandboxes if any(c.sandbox == s and not c.blocked for c in clients.values())
        }
        if not sandboxes:
            return
        for sandbox in sorted(sandboxes):
            containers = [c.container_id for c in clients.values() if c.sandbox == sandbox]
            try:
                await self._records.mark_budget_spent(sandbox, containers)
            except DatabaseUnavailable as exc:  # blocked in the state still
                log.warning("egress.record_failed", sandbox=sandbox, reason=str(exc))
            log.warning("egress.budget_reached", sandbox=sandbox, day_bytes=self.day_bytes)
        await self.write_state(also_spent=sandboxes)  # first: no new connection from now
        await self._cut([c for c in clients.values() if c.sandbox in sandboxes])

    async def _stop(
        self,
        experiments: set[str],
        clients: Mapping[str, ProxyClient],
        totals: Mapping[str, Usage | int],
    ) -> None:
        """Record them capped, block them in the state, cut their connections. Caller
        holds :attr:`lock`."""
        if not experiments:
            return
        for experiment_id in sorted(experiments):
            containers = [
                c.container_id for c in clients.values() if c.experiment_id == experiment_id
            ]
            try:
                await self._records.mark_capped(experiment_id, containers)
            except DatabaseUnavailable as exc:  # blocked in the state still
                log.warning("egress.record_failed", experiment_id=experiment_id, reason=str(exc))
            total = totals.get(experiment_id)
            log.warning(
                "egress.cap_reached",
                experiment_id=experiment_id,
                bytes=total.bytes if isinstance(total, Usage) else total,
            )
        await self.write_state(also_blocked=experiments)  # first: no new connection from now
        await self._cut([c for c in clients.values() if c.experiment_id in experiments])

    async def _cut(self, clients: Iterable[ProxyClient]) -> None:
        """Close these containers' open connections to the proxy (``ss -K``)."""
        gateway, port = self.proxy
        for client in clients:
            closed = await asyncio.to_thread(cut, gateway, port, client.address)
            log.log(
                logging.ERROR if closed is None else logging.INFO,
                "egress.cut_failed" if closed is None else "egress.cut",
                experiment_id=client.experiment_id,
                address=client.address,
                connections=closed,
            )

    # -- a command's result, a container gone -----------------------------------------

    async def take_notice(self, container_id: str) -> str | None:
        """What the proxy refused this container since the last notice (and the cap, if
        it stopped its experiment since), for its command's result."""
        client = self.client(container_id)
        if client is None:
            return None
        await self._settle(client.address)
        await self.read_log()
        try:
            notices = await self._records.take_notices(container_id)
        except DatabaseUnavailable as exc:  # told at a later result
            log.warning("egress.record_failed", reason=str(exc))
            return None
        refused = [n.text for n in notices if n.kind == "refused"]
        capped = any(n.kind == "cap" for n in notices)
        budget = any(n.kind == "budget" for n in notices)
        if not (refused or capped or budget):
            return None
        return notice_text(
            refused[:MAX_PENDING],
            max(0, len(refused) - MAX_PENDING),
            capped=capped,
            allow=client.allow,
            max_bytes=self.max_bytes,
            budget=budget,
            day_bytes=self.day_bytes or 0,
        )

    async def _settle(self, address: str) -> None:
        """Wait (briefly) until Squid has closed this client's connections.

        Squid logs a connection when it ends, a moment after the command that made it
        exited; until then its last lines (the cap reached, a refusal) would miss this
        result. Bounded: a command left running in the background keeps its own.
        """
        gateway, port = self.proxy
        deadline = time.monotonic() + SETTLE_S
        while await asyncio.to_thread(open_connections, gateway, port, address):
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.01)

    async def forget(self, container_id: str) -> tuple[ProxyClient, Usage] | None:
        """A removed container: its last lines counted, its notices dropped, the state
        written without it; what its experiment moved so far."""
        client = self.client(container_id)
        if client is None:
            return None
        async with self.lock:
            await self.read_log_locked()  # while the state still maps its address to it
            await self.write_state()
        try:
            await self._records.take_notices(container_id)
            usage = (await self._records.load([client.experiment_id])).get(client.experiment_id)
        except DatabaseUnavailable:
            usage = None
        return client, usage or Usage(0, False)


def describe(usage: Usage) -> dict[str, Any]:
    return {"experiment_bytes": usage.bytes, "refused": usage.refused, "capped": usage.capped}
