"""A sandbox's prepared container: one started ahead for its next experiment.

Warm containers (:mod:`app.runtime.warm.pool`) wait in free slots, so they serve a
sandbox's first create only; its second, third and fourth (the baseline-plus-fixes
flow) would each wait for ``docker create`` and ``start``. So after each create of a
sandbox that holds a lease, one container like the one it just got (same image, same
limits, network "none", no environment of its own) is made in the background, in
the sandbox's own slot:

    <slot root>/.prepared-<token>/workspace   bind-mounted at /workspace

and the sandbox's next ``create_experiment`` takes it (:meth:`PreparedContainers.take`):
its folder is renamed to the experiment's (the mount follows the folder), CPU, memory
and pids limits updated if they changed, and it is admitted to the container shares
exactly as a cold create of that sandbox would be (:mod:`app.runtime.docker.handover`).
A request it cannot serve (another image, network, environment or /tmp size) removes
it, then goes the cold way; that create's container is the next one prepared.

What one tenant can make the server spend:

- one prepared container per sandbox, at most ``per_address`` (its share of the warm
  budget) per sign-in address;
- within the warm budget (WARM_MAX_CONTAINERS, WARM_MEMORY_MB): only what the
  free-slot pool neither holds nor wants (``WarmPool.spare``), so never its floor;
  until handed over it is not one of MAX_CONTAINERS' experiment containers (the warm
  budget counts it instead), so it never takes another tenant's place there;
- one background creation per create of the sandbox, one at a time: a loop of
  creates and destroys makes the server create no faster than the loop's own creates
  (and a failed one is not tried again before the sandbox's next create);
- it begins only in a lull: once no create of any sandbox, and no call waiting for a
  command, has been in flight in this process for ``delay_s`` (:meth:`work_began`,
  :meth:`work_ended`), or after ``HOLD_MAX_S`` at the latest, so a burst of creates
  (issue 26: 100 first calls at once) meets no prepared creation at the engine beside
  its own containers and first commands (an engine's create costs its daemons more
  CPU than a first command), and a steady stream of work delays one by ``HOLD_MAX_S``
  at most;
- at the engine it yields: it is sent only when no real creation waits
  (:mod:`app.runtime.docker.creates`), so it never delays another tenant's cold create
  beyond the one creation already under way.

Nothing is left behind: the slot's reset at the lease's end (idle expiry) removes the
sandbox's prepared container first (:meth:`drop`: this process's after its creation is
over, every process's by label); the server's stop removes this process's (by label
last, so one whose creation was cut short goes too); a check every ``check_every_s``
removes one whose lease ended through another process or whose container stopped;
the start-up sweep removes a dead process's. A leftover folder (a crash) is emptied
with its slot at the lease's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
import structlog

from app.errors import ServiceError
from app.runtime.backend import Container, ContainerSpec
from app.runtime.warm.folders import delete_quietly, make_folder, same_folder
from app.runtime.warm.pool import WarmBackend
from pool.background import cancel_and_wait
from pool.slots import Slot

log = structlog.get_logger(__name__)

PREFIX = ".prepared-"
# A creation at the engine is waited for at most this long by the create that wants it
# (its SDK calls time out first: 60 s each for create and start).
PENDING_WAIT_S = 150.0
# The longest a prepared creation waits for a lull in the creates: a server whose creates
# never pause still prepares its sandboxes' next containers, a minute late.
HOLD_MAX_S = 60.0


class PreparedBackend(WarmBackend, Protocol):
    """A backend that makes prepared containers and hands them over (DockerBackend)."""

    async def hand_over(
        self, warm: Container, spec: ContainerSpec, *, admit: bool = False
    ) -> Container | None:
        """``warm`` made the container ``spec`` asks for (``admit``: within the sandbox's
        share); None when it cannot be."""
        ...

    async def remove_prepared(self, sandbox_label: str | None = None) -> int:
        """Remove a sandbox's prepared containers (any process's), or this process's."""
        ...

    async def create(self, spec: ContainerSpec, *, begun: asyncio.Event | None = None) -> Container:
        """A started container; ``begun`` set once its creation has left the engine's gate."""
        ...


@dataclass(frozen=True)
class PreparedContainer:
    key: str
    address: str  # the sign-in address's label ("" when none)
    slot_root: Path
    root: Path  # <slot root>/.prepared-<token>
    identity: tuple[int, int]  # (st_dev, st_ino) of root when it was made
    container: Container


class PreparedContainers:
    """At most one prepared container per sandbox that holds a lease; see the module doc.

    Args:
        backend: Creates (in the background lane), hands over and removes them.
        holding: The slot a sandbox key holds now (None: none), as every process sees it.
        spare: How many containers the warm budget leaves beside the free-slot pool now.
        per_address: The most one sign-in address may hold (made or being made).
        owner: (uid, gid) the workspace is given to (None: this process's).
        check_every_s: How often leases and containers are checked.
        delay_s: How long after the last create in flight ended a prepared creation
            begins: the creates' first commands run meanwhile without an engine creation
            beside them (on 2 cores, with one beside it a first command took 425 ms p50
            against 281 ms in a cold container; with the delay 303 ms against 502 ms in a
            run at a higher load: tests/bench/bench_warm.py); agents take longer than this
            between creates.
    """

    def __init__(
        self,
        backend: PreparedBackend,
        *,
        holding: Callable[[str], Awaitable[Slot | None]],
        spare: Callable[[], int],
        per_address: int,
        owner: tuple[int, int] | None = None,
        check_every_s: float = 30.0,
        delay_s: float = 2.0,
    ) -> None:
        self._backend = backend
        self._holding = holding
        self._spare = spare
        self._per_address = per_address
        self._owner = owner
        self._every = check_every_s
        self._delay = delay_s
        self._held: dict[str, PreparedContainer] = {}  # by sandbox key
        # Creates and commands' calls of any sandbox in flight in this process, and when
        # the last one ended (monotonic): prepared creations begin in a lull of them.
        self._in_flight = 0
        self._last_ended = -math.inf
        self._lull = asyncio.Event()
        self._lull.set()
        # Being made, by key: the task, the address, and whether it has left the gate.
        self._making: dict[str, tuple[asyncio.Task[None], str, asyncio.Event]] = {}
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        # What happened so far (tests, benches, the log): made, handed over, not used.
        self.made = 0
        self.handed_over = 0
        self.not_used = 0

    def count(self) -> int:
        """Prepared containers held or being made (the warm budget counts both)."""
        return len(self._held) + len(self._making)

    @property
    def being_made(self) -> int:
        return len(self._making)

    def holds(self, key: str) -> bool:
        return key in self._held

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="prepared-containers")

    def work_began(self) -> None:
        """A create_experiment of any sandbox began, or a call that waits for a command:
        prepared creations wait for a lull."""
        self._in_flight += 1
        self._lull.clear()

    def work_ended(self) -> None:
        """Work begun before ended (made, answered, refused or cancelled)."""
        self._in_flight = max(0, self._in_flight - 1)
        self._last_ended = time.monotonic()
        if not self._in_flight:
            self._lull.set()

    def after_create(self, key: str, slot_root: Path, spec: ContainerSpec) -> None:
        """The sandbox ``key`` (its lease's slot ``slot_root``) just got the container
        ``spec`` asked for: begin one like it for its next create, in the background,
        when every bound of the module doc allows."""
        if self._stopping or key in self._held or key in self._making:
            return  # one per sandbox; and one creation at a time
        if spec.network != "none" or spec.env or spec.egress_allowlist is not None:
            return  # fixed at creation and the tenant's own: not made ahead
        if self.count() + 1 > self._spare():
            log.debug("prepared.no_room", count=self.count())
            return
        address = spec.signin_label
        mine = sum(1 for held in self._held.values() if held.address == address)
        mine += sum(1 for _, of, _ in self._making.values() if of == address)
        if mine >= self._per_address:
            log.debug("prepared.address_share_spent", held=mine)
            return
        begun = asyncio.Event()
        task = asyncio.create_task(self._prepare(key, address, slot_root, spec, begun))
        self._making[key] = (task, address, begun)

    async def take(
        self, key: str, slot_root: Path, spec: ContainerSpec, target: Path
    ) -> Container | None:
        """The sandbox's prepared container, as ``spec`` asks, with its folder renamed to
        ``target`` (whose ``workspace`` it mounts); None: none fits, go cold.

        One being made at the engine is waited for: it is ahead of any cold creation this
        call would begin now. One still waiting for its turn (real creations go first) is
        left for the sandbox's next create, and this one goes cold.

        Raises nothing of its own: a prepared container that cannot serve is removed.
        """
        making = self._making.get(key)
        if making is not None and making[2].is_set():
            # (asyncio.wait: a cancelled caller leaves the creation to end as it would.)
            await asyncio.wait({making[0]}, timeout=PENDING_WAIT_S)
        held = self._held.pop(key, None)  # taken: no second caller can have it
        if held is None:
            return None
        try:
            if held.slot_root != slot_root or not await asyncio.to_thread(
                same_folder, held.root, held.identity
            ):
                raise LookupError("its folder is gone (the slot was emptied)")
            container = await self._backend.hand_over(held.container, spec, admit=True)
            if container is None:
                raise LookupError("the request does not fit the prepared container")
            await asyncio.to_thread(os.rename, held.root, target)
        except (LookupError, OSError, ServiceError) as exc:
            # A refused admission goes cold too, and is refused there with its own words.
            self.not_used += 1
            log.info("prepared.not_used", reason=str(exc))
            with anyio.CancelScope(shield=True):
                await self._remove(held.container.container_id, held.root)
            return None
        self.handed_over += 1
        log.info("prepared.handed_over", container_id=container.container_id[:12])
        return container

    async def drop(self, key: str, sandbox_label: str) -> None:
        """The sandbox's lease ends (its slot is about to be emptied): its prepared
        container goes, one being made once its creation is over, and any other
        process's (by the sandbox's label)."""
        with anyio.CancelScope(shield=True):
            making = self._making.get(key)
            if making is not None:
                await cancel_and_wait(making[0])
            held = self._held.pop(key, None)
            if held is not None:
                await self._remove(held.container.container_id, held.root)
            try:
                await self._backend.remove_prepared(sandbox_label)
            except ServiceError:
                log.warning("prepared.remove_failed", exc_info=True)

    async def check(self) -> int:
        """Remove the prepared containers whose lease ended (through another process),
        whose folder went or whose container stopped (an engine restart); how many."""
        running = await self._backend.running() if self._held else set()
        gone = 0
        for key, held in list(self._held.items()):
            slot = await self._holding(key)
            kept = held.container.container_id in running and slot is not None
            if kept and slot is not None and slot.root == held.slot_root:
                kept = await asyncio.to_thread(same_folder, held.root, held.identity)
            else:
                kept = False
            if kept:
                continue
            if self._held.get(key) is not held:
                continue  # taken meanwhile
            del self._held[key]
            await self._remove(held.container.container_id, held.root)
            gone += 1
        if gone:
            log.info("prepared.checked", removed=gone, held=len(self._held))
        return gone

    async def stop(self) -> None:
        """Stop making them and remove this process's, those whose creation was cut
        short included (by label, last)."""
        self._stopping = True
        await cancel_and_wait(self._task)
        self._task = None
        with anyio.CancelScope(shield=True):
            for task, _, _ in list(self._making.values()):
                await cancel_and_wait(task)
            for held in list(self._held.values()):
                await self._remove(held.container.container_id, held.root)
            self._held.clear()
            try:
                await self._backend.remove_prepared()
            except ServiceError:
                log.warning("prepared.remove_failed", exc_info=True)

    async def _prepare(
        self, key: str, address: str, slot_root: Path, asked: ContainerSpec, begun: asyncio.Event
    ) -> None:
        root = slot_root / f"{PREFIX}{secrets.token_hex(6)}"
        made: Container | None = None
        try:
            await self._wait_for_a_lull()  # the creates and their first commands go first
            identity = await asyncio.to_thread(make_folder, root, self._owner)
            spec = ContainerSpec(
                experiment_id=f"prepared-{root.name.removeprefix(PREFIX)}",
                sandbox_label=asked.sandbox_label,
                image=asked.image,
                workspace=root / "workspace",
                limits=asked.limits,
                signin_label=asked.signin_label,
                prepared=True,
            )
            made = await self._backend.create(spec, begun=begun)
            slot = await self._holding(key)
            if self._stopping or slot is None or slot.root != slot_root:
                raise LookupError("the sandbox's lease ended while its container was made")
            self._held[key] = PreparedContainer(key, address, slot_root, root, identity, made)
            self.made += 1
            log.info("prepared.made", container_id=made.container_id[:12])
        except (OSError, ServiceError, LookupError) as exc:
            # Not tried again before the sandbox's next create (the churn bound).
            log.info("prepared.not_made", reason=str(exc))
            with anyio.CancelScope(shield=True):
                await self._remove(made.container_id if made else None, root)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._remove(made.container_id if made else None, root)
            raise
        finally:
            self._making.pop(key, None)

    async def _wait_for_a_lull(self) -> None:
        """Until no work has been in flight for ``delay_s``, ``HOLD_MAX_S`` at most."""
        deadline = time.monotonic() + HOLD_MAX_S
        while (now := time.monotonic()) < deadline:
            if self._in_flight:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._lull.wait(), deadline - now)
                continue
            rest = self._last_ended + self._delay - now
            if rest <= 0:
                return
            await asyncio.sleep(min(rest, deadline - now))

    async def _remove(self, container_id: str | None, root: Path) -> None:
        if container_id is not None:
            try:
                await self._backend.remove(container_id)
            except ServiceError:
                log.warning("prepared.remove_failed", container_id=container_id[:12])
        await asyncio.to_thread(delete_quietly, root, "prepared.folder_left")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            try:
                await self.check()
            except Exception:  # the loop must outlive one bad check
                log.exception("prepared.check_failed")
