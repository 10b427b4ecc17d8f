"""A fake SandboxBackend for unit tests of the experiment manager (never proof of isolation)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.runtime.backend import (
    Container,
    ContainerSpec,
    ExecResult,
    GitSource,
    Isolation,
    Revival,
    RuntimeInfo,
)


@dataclass
class FakeBackend:
    """Understands three commands: `exit N`, `sleep S` and `echo TEXT`."""

    containers: dict[str, ContainerSpec] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    cancelled: set[str] = field(default_factory=set)
    ran: list[str] = field(default_factory=list)
    cloned_for: list[str] = field(default_factory=list)  # the sandbox label of each clone
    killed_trees: list[tuple[str, tuple[int, int]]] = field(default_factory=list)
    killed_all: list[str] = field(default_factory=list)  # containers kill_all emptied
    stopped: set[str] = field(default_factory=set)  # containers the "engine" holds stopped
    host_processes: dict[str, list[int]] = field(default_factory=dict)  # host pids, by container
    # When set, a clone waits for it (a slow repository) before it goes on.
    clone_gate: asyncio.Event | None = None
    _events: dict[str, asyncio.Event] = field(default_factory=dict)

    async def info(self) -> RuntimeInfo:
        return RuntimeInfo(True, "fake", ("img:1",), ())

    async def create(self, spec: ContainerSpec) -> Container:
        container_id = f"c-{spec.experiment_id}"
        self.containers[container_id] = spec
        isolation = Isolation(
            spec.image,
            "1000:1000",
            spec.network,
            spec.limits.cpus,
            spec.limits.memory_mb,
            spec.limits.pids,
            spec.limits.tmp_mb,
            ("CHOWN",),
            True,
            (),
            ("/workspace",),
        )
        return Container(container_id, isolation, ())

    async def run(
        self,
        container_id: str,
        command: str,
        *,
        timeout_s: float,
        job_id: str,
        max_output_bytes: int = 1_048_576,
        env: dict[str, str] | None = None,
        on_start: Callable[[tuple[int, int]], Awaitable[None]] | None = None,
    ) -> ExecResult:
        self.ran.append(command)
        started = time.monotonic()
        # A cancel finds the job from the start (as the real backend's job table).
        event = self._events.setdefault(job_id, asyncio.Event())
        if on_start is not None:
            await on_start((1, 2))
        if match := re.fullmatch(r"sleep ([\d.]+)", command):
            try:
                await asyncio.wait_for(event.wait(), min(float(match.group(1)), timeout_s))
                return ExecResult(
                    None, "", "", False, False, time.monotonic() - started, cancelled=True
                )
            except TimeoutError:
                timed_out = float(match.group(1)) > timeout_s
                return ExecResult(
                    None if timed_out else 0,
                    "",
                    "",
                    False,
                    False,
                    time.monotonic() - started,
                    timed_out=timed_out,
                )
        if match := re.fullmatch(r"exit (\d+)", command):
            return ExecResult(int(match.group(1)), "", "", False, False, 0.01)
        return ExecResult(0, command.removeprefix("echo ") + "\n", "", False, False, 0.01)

    async def clone(
        self,
        source: GitSource,
        workspace: Path,
        *,
        timeout_s: float = 300,
        sandbox_label: str = "",
        signin_label: str = "",
    ) -> ExecResult:
        """Pretends to clone: writes the ref it was asked for, or fails for ref "bad"."""
        self.cloned_for.append(sandbox_label)
        if self.clone_gate is not None:
            await self.clone_gate.wait()
        if source.ref == "bad":
            return ExecResult(128, "", "fatal: Remote branch bad not found", False, False, 0.01)
        (workspace / "CLONED_FROM").write_text(f"{source.url or source.local_path}@{source.ref}")
        return ExecResult(0, "", "", False, False, 0.01)

    async def cancel(self, container_id: str, job_id: str) -> bool:
        self.cancelled.add(job_id)
        event = self._events.get(job_id)
        if event is None:
            return False
        event.set()
        return True

    async def remove(self, container_id: str) -> None:
        self.removed.append(container_id)
        self.containers.pop(container_id, None)

    async def kill_tree(self, container_id: str, pids: tuple[int, int]) -> bool:
        self.killed_trees.append((container_id, pids))
        return True

    async def kill_all(self, container_id: str) -> None:
        self.killed_all.append(container_id)

    async def stop(self, container_id: str) -> None:
        self.stopped.add(container_id)

    async def host_pids(self, container_id: str) -> list[int]:
        return list(self.host_processes.get(container_id, ()))

    async def revive(self, container_ids: set[str]) -> Revival:
        revived = sorted(c for c in self.stopped if c in container_ids)
        self.stopped -= set(revived)
        missing = sorted(c for c in container_ids if c not in self.containers)
        return Revival(revived, missing)

    async def sweep(
        self, live_container_ids: set[str], live_processes: frozenset[str] = frozenset()
    ) -> int:
        orphans = [c for c in self.containers if c not in live_container_ids]
        for container_id in orphans:
            await self.remove(container_id)
        return len(orphans)

    async def aclose(self) -> None:
        return None
