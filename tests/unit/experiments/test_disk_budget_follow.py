"""The disk budget follows a sandbox after its writing call or job while it may write.

A job's end is not the end of its writing (a command that kills its supervisor leaves
its tree under the container's PID 1, which may pause before it writes): each
interval's check measures a sandbox with live containers, stops it past the budget,
retries a failed kill at the next interval, and lets it go once its containers are gone.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from deep_trees import build_deep_tree
from runtime_fakes import FakeBackend

from app.experiments.core.jobs import JobRegistry
from app.experiments.core.records import DiskHoldings
from app.experiments.disk_budget import DiskBudget, QuotaExceeded
from app.experiments.workspace.trash import Trash
from app.runtime.backend import ExecResult
from app.runtime.errors import RuntimeUnavailable
from jail.tree_delete import delete_tree

MB = 1_048_576
KEY = "sandbox"


@dataclass
class KillRecorder(FakeBackend):
    kills: int = 0
    kills_to_fail: int = 0

    commands: list[str] = field(default_factory=list)

    async def run(self, container_id: str, command: str, **kwargs: object) -> ExecResult:  # type: ignore[override]
        self.commands.append(command)
        return await super().run(container_id, command, **kwargs)  # type: ignore[arg-type]

    async def kill_all(self, container_id: str) -> None:
        self.kills += 1
        if self.kills_to_fail > 0:
            self.kills_to_fail -= 1
            raise RuntimeUnavailable("The container runtime is unavailable (HTTP 500).")


@dataclass
class World:
    root: Path
    backend: KillRecorder = field(default_factory=KillRecorder)
    containers: list[str] = field(default_factory=lambda: ["c-1"])
    reads: int = 0
    budget: DiskBudget | None = None

    def grow(self, mb: int) -> None:
        with (self.root / "big").open("ab") as f:
            f.write(b"x" * mb * MB)

    async def holdings_of(self, sandbox_key: str) -> DiskHoldings:
        self.reads += 1  # one per measurement, and one per interval's look at it
        return DiskHoldings(tuple(self.containers), 0)


def a_world(
    tmp_path: Path,
    limit_mb: int = 8,
    max_entries: int = 1000,
    trash_settled: Callable[[Path, float], Awaitable[bool]] | None = None,
) -> tuple[World, DiskBudget]:
    world = World(tmp_path)
    budget = DiskBudget(
        slot_root_of=lambda key: tmp_path,
        holdings_of=world.holdings_of,
        jobs=JobRegistry(),
        backend=world.backend,
        limit_bytes=limit_mb * MB,
        max_entries=max_entries,
        interval_s=0.5,
        trash_settled=trash_settled,
    )
    return world, budget


async def after_a_writing_call(budget: DiskBudget) -> None:
    budget.after("execute_experiment", KEY)
    await asyncio.gather(*budget._background)  # the measurement the call started


async def test_a_sandbox_growing_after_its_job_is_stopped_once(tmp_path: Path) -> None:
    world, budget = a_world(tmp_path)
    await after_a_writing_call(budget)  # its job ended with the call; its writer did not
    for _ in range(3):
        world.grow(2)
        await budget.check_once()
    assert world.backend.kills == 0  # 6 MB: under the budget of 8
    world.grow(4)
    await budget.check_once()
    assert world.backend.kills == 1  # 10 MB: stopped
    await budget.check_once()  # no growth since: measured, not stopped again
    await budget.check_once()
    assert world.backend.kills == 1


async def test_a_writer_that_pauses_past_an_interval_is_still_stopped(tmp_path: Path) -> None:
    world, budget = a_world(tmp_path)
    await after_a_writing_call(budget)
    for _ in range(4):  # quiet for four intervals, no call in between
        await budget.check_once()
    world.grow(10)
    await budget.check_once()
    assert world.backend.kills == 1


async def test_a_sandbox_with_live_containers_costs_one_walk_an_interval(tmp_path: Path) -> None:
    world, budget = a_world(tmp_path)
    world.grow(1)
    await after_a_writing_call(budget)
    for _ in range(4):
        await budget.check_once()
    # The call's measurement (one read of the records); then each interval a look at
    # its containers, which its measurement uses (one).
    assert world.reads == 1 + 4


async def test_a_sandbox_whose_containers_are_gone_is_let_go_unmeasured(tmp_path: Path) -> None:
    world, budget = a_world(tmp_path)
    await after_a_writing_call(budget)
    world.containers.clear()
    world.grow(1)
    await budget.check_once()
    await budget.check_once()
    assert world.reads == 1 + 2  # the call's measurement, then a look each interval


async def test_a_failed_kill_is_tried_again_at_the_next_interval(tmp_path: Path) -> None:
    world, budget = a_world(tmp_path)
    world.backend.kills_to_fail = 2
    await after_a_writing_call(budget)
    world.grow(10)
    await budget.check_once()
    assert world.backend.kills == 1  # failed (the engine away even for the restart, say)
    await budget.check_once()
    assert world.backend.kills == 2  # no growth, but the stop is still owed: failed again
    await budget.check_once()
    assert world.backend.kills == 3  # done
    await budget.check_once()
    await budget.check_once()
    assert world.backend.kills == 3  # once stopped, not again while it does not grow


async def test_a_sandbox_still_growing_after_its_stop_is_stopped_again(tmp_path: Path) -> None:
    world, budget = a_world(tmp_path)
    await after_a_writing_call(budget)
    world.grow(10)
    await budget.check_once()
    assert world.backend.kills == 1
    world.grow(2)  # something of it survived the stop
    await budget.check_once()
    assert world.backend.kills == 2


async def test_a_tree_too_deep_to_measure_is_refused_as_such(tmp_path: Path) -> None:
    _, budget = a_world(tmp_path, max_entries=10_000)
    build_deep_tree(tmp_path, 2100, bottom_file=("big", b"x"))  # "d/" * 2100: past PATH_MAX
    try:
        with pytest.raises(QuotaExceeded, match="nested too deep"):
            await budget.before("write_sandbox_file", KEY)
    finally:
        delete_tree(tmp_path / "d")  # pytest's own clean-up would recurse


async def test_a_sandbox_that_destroyed_to_free_space_is_admitted_once_its_trash_is_gone(
    tmp_path: Path,
) -> None:
    """The refusal says: destroy an experiment, then continue. The destroyed folder goes to
    the slot's trash and one worker deletes every sandbox's trash; on a busy server the
    next call came while it was still there and was refused again (CI, loaded)."""
    release = threading.Event()

    def held(path: Path, stop: threading.Event) -> None:
        release.wait(30)  # the deletion lags until the test lets it go
        delete_tree(path, stop=stop)

    trash = Trash(delete=held)
    _, budget = a_world(tmp_path, trash_settled=trash.settled)
    experiment = tmp_path / "exp-a"
    experiment.mkdir()
    (experiment / "big").write_bytes(b"x" * 12 * MB)
    await after_a_writing_call(budget)
    with pytest.raises(QuotaExceeded):
        await budget.before("execute_experiment", KEY)

    await trash.discard(experiment)  # destroy_experiment: moved aside, not yet deleted
    admitted = asyncio.create_task(budget.before("create_experiment", KEY))
    await asyncio.sleep(0.2)
    assert not admitted.done()  # it waits for the deletion instead of refusing at once
    release.set()
    await asyncio.wait_for(admitted, 30)  # admitted: measured once the trash was gone
    await trash.close()


async def test_a_sandbox_over_its_budget_with_no_trash_is_refused_at_once(
    tmp_path: Path,
) -> None:
    trash = Trash()
    world, budget = a_world(tmp_path, trash_settled=trash.settled)
    world.grow(12)
    await after_a_writing_call(budget)
    with pytest.raises(QuotaExceeded):
        await asyncio.wait_for(budget.before("execute_experiment", KEY), 5)
    await trash.close()


async def test_the_kill_never_runs_as_a_command_in_the_sandbox(tmp_path: Path) -> None:
    """The sandbox's command path (its executor) is the tenant's: it can stop or kill
    it, so a stop through it may never come. The kill goes around it (kill_all)."""
    world, budget = a_world(tmp_path)
    await after_a_writing_call(budget)
    world.grow(10)
    await budget.check_once()
    assert world.backend.kills == 1
    assert world.backend.commands == []


async def test_a_slow_sandbox_does_not_put_off_another_sandboxs_check(tmp_path: Path) -> None:
    """Each interval's checks run side by side: one sandbox's slow check (its walk, its
    docker top, its kill, under load) must not hold up the stop of another's writer."""
    (tmp_path / "slow").mkdir()
    (tmp_path / "fast").mkdir()
    world = World(tmp_path / "fast")
    held = asyncio.Event()
    slow_asked = asyncio.Event()

    async def holdings_of(sandbox_key: str) -> DiskHoldings:
        if sandbox_key == "slow":
            slow_asked.set()
            await held.wait()  # its engine calls do not answer yet
        else:
            await slow_asked.wait()  # checked while the slow one is, whatever the order
        return DiskHoldings(("c-" + sandbox_key,), 0)

    budget = DiskBudget(
        slot_root_of=lambda key: tmp_path / key,
        holdings_of=holdings_of,
        jobs=JobRegistry(),
        backend=world.backend,
        limit_bytes=8 * MB,
        max_entries=1000,
        interval_s=0.5,
    )
    budget._watched.update({"slow", "fast"})
    world.grow(10)  # the fast sandbox is over
    check = asyncio.create_task(budget.check_once())
    for _ in range(1000):  # bounded: until the fast sandbox was stopped
        if world.backend.kills:
            break
        await asyncio.sleep(0.01)
    stopped_while_held = world.backend.kills
    held.set()
    slow_asked.set()
    await check
    assert stopped_while_held == 1, "the slow sandbox held up the other's stop"


async def test_a_call_s_measurement_during_a_round_stands_for_the_round_s(
    tmp_path: Path,
) -> None:
    """Under a burst a round of every watched sandbox, four at a time, takes longer than
    an interval, while each call measures its sandbox anyway: a sandbox measured after
    the round began (by its call) is not measured again by the round, and the others
    are measured as before."""
    keys = ["a", "b", "c", "d", "e"]
    reads = dict.fromkeys(keys, 0)
    first: list[str] = []  # the round's first four, whichever its order
    held = asyncio.Event()
    busy = asyncio.Event()

    async def holdings_of(sandbox_key: str) -> DiskHoldings:
        reads[sandbox_key] += 1
        if not held.is_set() and len(first) < 4:
            first.append(sandbox_key)
            if len(first) == 4:
                busy.set()  # the round's four checks at once wait here
            await held.wait()
        return DiskHoldings(("c-" + sandbox_key,), 0)

    for key in keys:
        (tmp_path / key).mkdir()
    budget = DiskBudget(
        slot_root_of=lambda key: tmp_path / key,
        holdings_of=holdings_of,
        jobs=JobRegistry(),
        backend=KillRecorder(),
        limit_bytes=8 * MB,
        max_entries=1000,
        interval_s=0.5,
    )
    budget._watched.update(keys)
    check = asyncio.create_task(budget.check_once())
    await asyncio.wait_for(busy.wait(), 60)
    [late] = set(keys) - set(first)
    assert reads[late] == 0  # its turn in the round has not come
    budget.after("execute_experiment", late)  # its call ends: measured now
    await asyncio.gather(*budget._background)
    assert reads[late] == 1
    held.set()
    await check
    assert reads == dict.fromkeys(keys, 1)  # the late one's, by its call
    await budget.check_once()  # the next round measures every one
    assert reads == dict.fromkeys(keys, 2)


async def test_a_measurement_every_caller_left_fails_without_an_unretrieved_error(
    tmp_path: Path,
) -> None:
    """A measurement's callers may all leave (a call cancelled, the server stopping)
    while its walk goes on; if it then fails (its database read cut off at shutdown),
    nobody reads the error: asyncio reported "Task exception was never retrieved" on
    every stop of a busy server."""
    _, budget = a_world(tmp_path)
    started, release = asyncio.Event(), asyncio.Event()

    async def cut_off(sandbox_key: str) -> DiskHoldings:
        started.set()
        await release.wait()
        raise ConnectionResetError("the database went away mid-transaction")

    budget._holdings_of = cut_off  # type: ignore[method-assign]
    reported: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        caller = asyncio.create_task(budget.measure(KEY))
        await started.wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        release.set()
        for _ in range(100):  # until the shielded walk has ended (bounded)
            if not budget._measuring:
                break
            await asyncio.sleep(0.01)
        assert not budget._measuring
        gc.collect()  # an unretrieved error is reported when its task is collected
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert [c for c in reported if "never retrieved" in str(c.get("message"))] == []
