"""Warm sandboxes: hardened containers started before anyone asks, one per free slot.

A new sandbox's first ``create_experiment`` would otherwise wait for ``docker
create`` and ``start`` (about 250 ms here, seconds in a burst). The pool keeps as
many containers of the default image running as its demand asks
(:mod:`app.runtime.warm.demand`: sign-ins, the queue, the rate of creates, within a
budget; ``count`` without one), each created by the backend exactly like a cold one
(same hardening, same code path), and each attached to one of the free slots the
pool hands out next (lowest index first):

    <slot root>/.warm-<token>/workspace   bind-mounted at /workspace

Why a slot, and not a shared folder moved in later: on ZFS a slot is a dataset
of its own (its quota), and a folder cannot be renamed across datasets. A
mount is fixed when the container starts, so a warm container must be born in
the slot whose sandbox will use it.

Hand-over (:meth:`WarmPool.take`): only the caller whose slot it is can get the
slot's warm container, and it is removed from the pool the moment it is taken,
so it is never shared between sandbox keys; a destroyed experiment's container
is removed as any other, and the pool makes a new one (replaced, never reused).
Its folder is renamed to the experiment's (same filesystem, the mount follows
the folder), its CPU, memory and pids limits are updated to the request's, and
from then on it counts in the caller's container share. A request it cannot
serve (another image, network, environment or /tmp size) removes it first, then
goes the cold way.

Growing and shrinking: each pass begins the containers the target still lacks,
several at once (``concurrent_makes``), and does not wait for them, so the next pass
(woken at once by a rising signal) follows a target that rose meanwhile. A caller
whose slot's container has not begun yet goes cold rather than wait behind other
slots' makes; one whose container has begun waits for it. When the target falls, the
surplus goes, the slots handed out last first; a container whose slot was leased
meanwhile is its lessee's (its create is coming for it) and is neither surplus nor
counted in the stock the target is compared with.

Capacity (see :mod:`app.runtime.docker.capacity`): a warm container is the first
container of its slot, counted under a key of its own (``warm-slot-NNN``), and
a slot never holds a warm container beside one of its sandbox's: a sandbox's
first create takes it or removes it before anything else is admitted, and the
pool only fills free slots. So every slot's promise still holds.

A slot emptied while it held an unused warm container loses the folder (dir:
moved to the trash; zfs: rolled back); the pool notices (the folder's identity
is checked on every pass and at hand-over) and replaces the container, as it
replaces one that stopped (an engine restart).

Several server processes (``app.runtime.warm.claims``): each keeps warm
containers of its own in the free slots they share, and claims a slot before it
makes anything there, so no slot ever holds two. Only the process that made a
warm container hands it over; a sandbox whose first create reaches another
process removes it (its claim first) and goes the cold way, so the slot still
holds its sandbox's containers only. A process that dies leaves its claims: once
its heartbeat is stale, the next pass of any other process removes its warm
containers and folders and claims the slots afresh; a starting process deletes
only the warm folders no claim names.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
import structlog

from app.errors import ServiceError
from app.runtime.backend import Container, ContainerSpec, SandboxBackend
from app.runtime.warm.claims import LocalWarmClaims, WarmClaim, WarmClaimLedger
from app.runtime.warm.demand import WarmDemand
from app.runtime.warm.folders import delete_quietly, make_folder, same_folder
from app.sampling import ThrottledLog
from pool.background import cancel_and_wait
from pool.slots import Slot

log = structlog.get_logger(__name__)

PREFIX = ".warm-"
# A warm creation in flight for the caller's slot is waited for at most this long: it is
# already in the engine's line, ahead of any cold create the caller would start now, so
# it is the quickest way to a container; a burst made that line 45 s long here (2 cores,
# heavy load), and 30 s sent callers cold at the line's end. The creation's own SDK
# calls time out first (60 s each for create and start).
PENDING_WAIT_S = 150.0
_POLL_S = 0.1


class WarmBackend(SandboxBackend, Protocol):
    """A backend that can hand a running container over (DockerBackend)."""

    async def running(self) -> set[str]:
        """The ids of our containers that are running now."""
        ...

    def claim(self, container_id: str, sandbox_label: str) -> None:
        """Count ``container_id`` in ``sandbox_label``'s share from now on."""
        ...

    async def hand_over(self, warm: Container, spec: ContainerSpec) -> Container | None:
        """``warm`` made the container ``spec`` asks for; None when it cannot be."""
        ...


@dataclass(frozen=True)
class WarmContainer:
    slot: Slot
    root: Path  # <slot root>/.warm-<token>
    identity: tuple[int, int]  # (st_dev, st_ino) of root when it was made
    container: Container
    claim: WarmClaim


class WarmPool:
    """Warm containers of ``image``, one per free slot, as many as ``demand`` asks
    (``count`` without it); see the module doc.

    Args:
        backend: Creates, hands over and removes the containers.
        next_free: The ``n`` free slots the pool hands out next.
        count: How many to keep ready at least (0 and no demand: the pool does nothing).
        demand: The sizing policy (``app.runtime.warm.demand``): grows the pool with
            sign-ins, a queue and the rate of creates, within its budget.
        concurrent_makes: How many warm containers are started at once (the engine
            serves a few creates at a time well, more only queue inside it).
        image: The image they run (the default image).
        owner: (uid, gid) the workspace is given to (None: this process's).
        refill_every_s: How often the pool looks for newly freed slots.
        claims: The slots' claims every process sees (default: this process's only).
        process_id: This process, as its claims and heartbeat name it.
        live_processes: The processes whose heartbeat is fresh (default: this one).
        refresh_free: Re-reads which slots are free, when other processes change them.
    """

    def __init__(
        self,
        backend: WarmBackend,
        next_free: Callable[[int], list[Slot]],
        *,
        count: int,
        image: str,
        demand: WarmDemand | None = None,
        concurrent_makes: int = 4,
        owner: tuple[int, int] | None = None,
        refill_every_s: float = 5.0,
        claims: WarmClaimLedger | None = None,
        process_id: str = "this-process",
        live_processes: Callable[[], Awaitable[set[str]]] | None = None,
        refresh_free: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._backend = backend
        self._next_free = next_free
        self.count = count
        self._demand = demand
        self._makes = anyio.CapacityLimiter(concurrent_makes)
        self._image = image
        self._owner = owner
        self._every = refill_every_s
        self._claims: WarmClaimLedger = claims or LocalWarmClaims()
        self._me = process_id
        self._live = live_processes
        self._refresh_free = refresh_free
        self._ready: dict[Path, WarmContainer] = {}  # by slot root
        self._pending: dict[Path, asyncio.Event] = {}
        self._awaited: set[Path] = set()  # slots whose lessee waits for their creation
        # Pending slots whose creation has not begun (it waits for a place among the
        # makes): their lessee goes cold rather than wait behind other slots' makes.
        self._unstarted: set[Path] = set()
        self._making: set[asyncio.Task[int]] = set()  # makes under way, each a task
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Set once a pass and the makes it began are over (tests and benches wait on it).
        self.filled = asyncio.Event()
        # Docker down refuses every slot on every pass: one line a minute per reason.
        self._refusals = ThrottledLog(log)
        if demand is not None:
            demand.on_change(self._wake.set)  # a rising signal starts a pass at once

    def target(self) -> int:
        """How many warm containers the pool keeps now."""
        return self._demand.target() if self._demand is not None else self.count

    @property
    def ceiling(self) -> int:
        return self._demand.budget.ceiling if self._demand is not None else self.count

    @property
    def ready(self) -> int:
        return len(self._ready)

    def spare(self) -> int:
        """What the warm budget leaves beside this pool now, where the sandboxes' prepared
        containers (``app.runtime.warm.prepared``) live: its ceiling less the most of its
        floor (always kept for it), what it holds or is making, and what it wants (its
        target) as far as the free slots can hold it (a target past them holds nothing)."""
        target = self.target()
        mine = len(self._ready) + len(self._pending)
        wanted = min(target, len(self._next_free(target))) if target > mine else 0
        held = max(self.count if self._demand is None else self._demand.budget.floor, mine, wanted)
        return max(0, self.ceiling - held)

    def ready_slots(self) -> list[Path]:
        return list(self._ready)

    def claim(self, container_id: str, sandbox_label: str) -> None:
        """After a restart: a handed-over container counts in its sandbox's share again."""
        self._backend.claim(container_id, sandbox_label)

    def start(self, slot_roots: Iterable[Path] = ()) -> None:
        """Start filling, after deleting the folders of an earlier run's warm containers
        (the start-up sweep removed the containers) from ``slot_roots``."""
        if self.ceiling > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(list(slot_roots)), name="warm-pool")

    async def stop(self) -> None:
        """Stop refilling and remove the unused warm containers and their folders."""
        await cancel_and_wait(self._task)
        self._task = None
        for making in list(self._making):
            making.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await making
        with anyio.CancelScope(shield=True):
            for warm in list(self._ready.values()):
                await self._discard(warm)

    async def take(self, slot_root: Path, spec: ContainerSpec, target: Path) -> Container | None:
        """The warm container of the caller's slot, as ``spec`` asks, with its folder
        renamed to ``target`` (whose ``workspace`` it mounts); None: none fits, go cold.

        ``slot_root`` is the caller's own slot (from its lease), so no other key can get it.
        """
        if self._demand is not None:
            self._demand.created()
        if slot_root in self._unstarted:
            self._unstarted.discard(slot_root)  # its make is dropped when its turn comes
            return None
        pending = self._pending.get(slot_root)
        if pending is not None:
            self._awaited.add(slot_root)  # its lessee waits here: it stays when made
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(pending.wait(), PENDING_WAIT_S)
            finally:
                self._awaited.discard(slot_root)
        claim = await self._claims.of_slot(slot_root.name)
        warm = self._ready.pop(slot_root, None)  # taken: no second caller can have it
        if claim is None:
            return None  # none in this slot (one this process made was removed elsewhere)
        if warm is None or warm.claim.root != claim.root:
            # Another process's: only its maker hands it over. Removed, so the slot holds
            # its sandbox's containers only; this create goes the cold way.
            await self._remove_foreign(claim)
            return None
        if not await self._claims.release(warm.claim):
            return None  # another process removed it a moment ago: leave it alone
        self._wake.set()
        try:
            if not await asyncio.to_thread(same_folder, warm.root, warm.identity):
                raise LookupError("the warm folder is gone (its slot was emptied)")
            container = await self._backend.hand_over(warm.container, spec)
            if container is None:
                raise LookupError("the request does not fit the warm container")
            await asyncio.to_thread(os.rename, warm.root, target)
        except (LookupError, OSError, ServiceError) as exc:
            log.info("warm.not_used", slot=warm.slot.name, reason=str(exc))
            with anyio.CancelScope(shield=True):
                await self._remove(warm.container.container_id, warm.root)
            return None
        log.info("warm.handed_over", slot=warm.slot.name, container_id=container.container_id[:12])
        return container

    async def fill(self) -> int:
        """One pass, waiting for the containers it starts (tests and benches); how many
        were started. See :meth:`_pass`."""
        makes = await self._pass()
        started = sum(await asyncio.gather(*makes)) if makes else 0
        if started:
            log.info("warm.filled", started=started, ready=len(self._ready))
        return started

    async def _pass(self) -> list[asyncio.Task[int]]:
        """Forget warm containers another process took or removed, drop those whose
        folder is gone, remove dead processes' ones, remove the surplus when the target
        fell, then begin new ones on the next free unclaimed slots up to the target; the
        makes begun (tasks: the next pass need not wait for them, so the pool follows a
        target that rises while they run)."""
        claims = {claim.slot: claim for claim in await self._claims.all()}
        for warm in list(self._ready.values()):
            if claims.get(warm.claim.slot) != warm.claim:
                # Its claim is gone: the process that released it removed the container.
                self._ready.pop(warm.slot.root, None)
                log.info("warm.removed_elsewhere", slot=warm.slot.name)
        # Gone stale: the folder went with a slot reset, or the engine restarted and the
        # container stopped.
        running = await self._backend.running() if self._ready else set()
        for warm in list(self._ready.values()):
            fresh = warm.container.container_id in running
            if not fresh or not await asyncio.to_thread(same_folder, warm.root, warm.identity):
                if self._ready.pop(warm.slot.root, None) is None:
                    continue  # handed over meanwhile
                claims.pop(warm.claim.slot, None)
                await self._discard(warm)
        for claim in await self._claims_of_dead(list(claims.values())):
            claims.pop(claim.slot, None)
            if await self._claims.release(claim):
                log.info("warm.orphan_removed", slot=claim.slot, owner=claim.process_id)
                await self._remove(claim.container_id, Path(claim.root))
        target = self.target()
        # A container whose slot was leased meanwhile is its lessee's, about to be taken:
        # not stock. Counted as stock, a burst's leases (which end the sign-in signal)
        # shrank the pool by the very containers its creates came for: 59 of 100 went
        # cold (issue 26, once the leases were written together).
        stock = self._in_free_slots()
        want = target - len(stock) - len(self._pending)
        if want < 0 and stock:
            await self._shrink(stock, min(len(stock), -want))
        # But they are containers all the same: what the pool holds and makes stays
        # within its ceiling (the budget), the lessees' containers included.
        want = min(want, self.ceiling - len(self._ready) - len(self._pending))
        if want <= 0:
            return []
        if self._refresh_free is not None:
            await self._refresh_free()  # another process may have leased one meanwhile
        taken = set(claims) | {root.name for root in self._pending}
        free = [s for s in self._next_free(target + len(taken)) if s.root.name not in taken]
        chosen = free[:want]
        # Marked before any await: a caller leased one of these slots meanwhile waits for
        # it, or goes cold while its make has not begun.
        for slot in chosen:
            self._pending[slot.root] = asyncio.Event()
            self._unstarted.add(slot.root)
        makes = [asyncio.create_task(self._make_pending(slot)) for slot in chosen]
        self._making.update(makes)
        for making in makes:
            making.add_done_callback(self._making.discard)
        if makes:
            log.info("warm.growing", begun=len(makes), ready=len(self._ready), target=target)
        return makes

    async def _make_pending(self, slot: Slot) -> int:
        """Make the warm container of a slot marked pending, in its turn among the makes
        (the slots handed out next are marked first, so they are made first)."""
        try:
            async with self._makes:
                if slot.root not in self._unstarted:
                    return 0  # its lessee went cold meanwhile
                self._unstarted.discard(slot.root)
                return await self._make(slot)
        except Exception:  # no one awaits a make begun by the loop: said here, not lost
            log.exception("warm.make_failed", slot=slot.name)
            return 0
        finally:
            self._unstarted.discard(slot.root)
            self._pending.pop(slot.root).set()
            if not self._pending:
                self._signal_filled()

    def _signal_filled(self) -> None:
        """A pass and every make it began are over (tests and benches wait for this)."""
        self.filled.set()
        self.filled.clear()

    def _in_free_slots(self) -> list[WarmContainer]:
        """The ready containers whose slot is still free (the pool's stock)."""
        free = {slot.root for slot in self._next_free(sys.maxsize)}
        return [warm for warm in self._ready.values() if warm.slot.root in free]

    async def _shrink(self, stock: list[WarmContainer], surplus: int) -> None:
        """Remove ``surplus`` of the unused warm containers ``stock`` (in free slots), those
        of the slots handed out last first (the pool's demand fell: they would wait idle)."""
        latest = sorted(stock, key=lambda warm: warm.slot.index, reverse=True)
        gone = [self._ready.pop(warm.slot.root) for warm in latest[:surplus]]  # none takes them
        for warm in gone:
            await self._discard(warm)
        log.info("warm.shrunk", removed=len(gone), ready=len(self._ready))

    async def _still_free(self, slot: Slot) -> bool:
        if self._refresh_free is None or slot.root in self._awaited:
            return True  # one process: its own view is current; or its lessee waits for it
        await self._refresh_free()
        return slot.root in {free.root for free in self._next_free(sys.maxsize)}

    async def _claims_of_dead(self, claims: list[WarmClaim]) -> list[WarmClaim]:
        others = [claim for claim in claims if claim.process_id != self._me]
        if not others or self._live is None:
            return []
        live = await self._live()
        return [claim for claim in others if claim.process_id not in live]

    async def _remove_foreign(self, claim: WarmClaim) -> None:
        """Remove another process's warm container from the caller's slot (its claim
        first, so that process leaves it alone), once its creation is over."""
        deadline = time.monotonic() + PENDING_WAIT_S
        while claim.container_id is None and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)  # its maker is creating it; then it is removed
            current = await self._claims.of_slot(claim.slot)
            if current is None or current.root != claim.root:
                return  # its maker gave it up
            claim = current
        with anyio.CancelScope(shield=True):
            if await self._claims.release(claim):
                log.info("warm.removed_foreign", slot=claim.slot, owner=claim.process_id)
                await self._remove(claim.container_id, Path(claim.root))

    async def _make(self, slot: Slot) -> int:
        root = slot.root / f"{PREFIX}{secrets.token_hex(6)}"
        claim = WarmClaim(slot.root.name, self._me, str(root))
        if not await self._claims.place(claim.slot, self._me, claim.root, time.time()):
            return 0  # another process claimed it a moment ago
        made: Container | None = None
        try:
            identity = await asyncio.to_thread(make_folder, root, self._owner)
            spec = ContainerSpec(
                experiment_id=f"warm-{root.name.removeprefix(PREFIX)}",
                sandbox_label=f"warm-{slot.name}",
                image=self._image,
                workspace=root / "workspace",
            )
            made = await self._backend.create(spec)
            claim = WarmClaim(claim.slot, self._me, claim.root, made.container_id)
            if not await self._claims.started(claim, made.container_id):
                # Its slot's sandbox reached another process, which gave it up meanwhile.
                raise LookupError("the slot was taken while its warm container started")
            if not await self._still_free(slot):
                # Leased through another process, whose create may have gone cold before
                # this claim: a warm container must not sit beside its sandbox's.
                raise LookupError("the slot was leased while its warm container started")
        except (OSError, ServiceError, LookupError) as exc:
            # Full, or Docker is down: try again at the next pass.
            self._refusals.info("warm.create_refused", str(exc), slot=slot.name, reason=str(exc))
            with anyio.CancelScope(shield=True):
                await self._claims.release(claim)
                await self._remove(made.container_id if made else None, root)
            return 0
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._claims.release(claim)
                await self._remove(made.container_id if made else None, root)
            raise
        self._ready[slot.root] = WarmContainer(slot, root, identity, made, claim)
        return 1

    async def _discard(self, warm: WarmContainer) -> None:
        if await self._claims.release(warm.claim):
            await self._remove(warm.container.container_id, warm.root)

    async def _remove(self, container_id: str | None, root: Path) -> None:
        if container_id is not None:
            try:
                await self._backend.remove(container_id)
            except ServiceError:
                log.warning("warm.remove_failed", container_id=container_id[:12])
        await asyncio.to_thread(delete_quietly, root, "warm.folder_left")

    async def _run(self, leftovers_in: list[Path]) -> None:
        # Another live process's warm folders are claimed: only unclaimed ones go.
        claimed = {Path(claim.root) for claim in await self._claims.all()}
        await asyncio.to_thread(_delete_leftovers, leftovers_in, claimed)
        while True:
            try:
                await self._pass()
            except Exception:  # the loop must outlive one bad pass
                log.exception("warm.fill_failed")
            if not self._pending:
                self._signal_filled()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._every)
            self._wake.clear()


def _delete_leftovers(slot_roots: list[Path], claimed: set[Path]) -> None:
    for slot_root in slot_roots:
        try:
            with os.scandir(slot_root) as entries:
                found = [e.name for e in entries if e.name.startswith(PREFIX)]
        except OSError:
            continue
        for name in found:
            if slot_root / name not in claimed:
                delete_quietly(slot_root / name, "warm.folder_left")
