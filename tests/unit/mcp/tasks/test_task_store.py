"""The task store: scoped to the sandbox key, bounded per sandbox and overall, kept a
while after the task ends."""

from __future__ import annotations

import pytest
from timing import fastest

from app.mcp.tasks.store import TaskStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def store(clock: Clock, *, keep_s: float = 60, per_sandbox: int = 3, total: int = 10) -> TaskStore:
    return TaskStore(keep_s=keep_s, max_per_sandbox=per_sandbox, max_total=total, clock=clock)


def test_a_task_is_found_only_by_its_own_sandbox_key(clock: Clock) -> None:
    tasks = store(clock)
    mine = tasks.open("alice", "execute_experiment")
    assert mine is not None
    assert tasks.get("alice", mine.task_id) is mine
    assert tasks.get("bob", mine.task_id) is None
    assert tasks.get("alice", "no-such-task") is None


def test_task_ids_are_distinct_and_random(clock: Clock) -> None:
    tasks = store(clock, per_sandbox=1000, total=1000)
    ids = set()
    for _ in range(500):
        record = tasks.open("alice", "run_tests")
        assert record is not None
        ids.add(record.task_id)
    assert len(ids) == 500
    assert all(len(task_id) == 36 for task_id in ids)


def test_a_finished_task_is_kept_keep_s_then_forgotten(clock: Clock) -> None:
    tasks = store(clock, keep_s=60)
    record = tasks.open("alice", "run_tests")
    assert record is not None
    assert tasks.ttl_s(record) is None  # running: never discarded
    clock.now += 500  # a long run does not count against keeping
    assert tasks.get("alice", record.task_id) is record
    tasks.finish(record, "completed", result={"content": [], "isError": False})
    assert tasks.ttl_s(record) == 560  # from creation: the run, then the keeping
    clock.now += 59
    assert tasks.get("alice", record.task_id) is record
    clock.now += 1
    assert tasks.get("alice", record.task_id) is None
    assert len(tasks) == 0


def test_a_task_ends_once(clock: Clock) -> None:
    tasks = store(clock)
    record = tasks.open("alice", "execute_experiment")
    assert record is not None
    tasks.finish(record, "cancelled", message="Cancelled.")
    clock.now += 5
    tasks.finish(record, "completed", result={"isError": False})
    assert record.status == "cancelled"
    assert record.result is None
    assert record.finished_at == 1_000.0


def test_a_new_task_evicts_the_sandbox_s_oldest_finished_one(clock: Clock) -> None:
    tasks = store(clock, per_sandbox=3)
    first, second, third = (tasks.open("alice", "run_tests") for _ in range(3))
    assert first is not None
    assert second is not None
    assert third is not None
    tasks.finish(second, "completed", result={})
    tasks.finish(first, "completed", result={})
    fourth = tasks.open("alice", "run_tests")
    assert fourth is not None
    # The oldest by creation among the finished ones goes; the running one stays.
    assert tasks.get("alice", first.task_id) is None
    assert tasks.get("alice", second.task_id) is second
    assert tasks.get("alice", third.task_id) is third


def test_a_sandbox_whose_tasks_all_run_gets_no_more(clock: Clock) -> None:
    tasks = store(clock, per_sandbox=2)
    assert tasks.open("alice", "run_tests") is not None
    assert tasks.open("alice", "run_tests") is not None
    assert tasks.open("alice", "run_tests") is None
    assert tasks.open("bob", "run_tests") is not None  # others are not affected


def test_the_server_wide_bound_evicts_the_most_crowded_sandbox_s_oldest_finished_task(
    clock: Clock,
) -> None:
    tasks = store(clock, per_sandbox=5, total=4)
    alices = [tasks.open("alice", "run_tests") for _ in range(3)]
    carols = tasks.open("carol", "run_tests")
    assert carols is not None
    for record in alices:
        assert record is not None
    tasks.finish(alices[1], "completed", result={})  # type: ignore[arg-type]
    tasks.finish(alices[2], "completed", result={})  # type: ignore[arg-type]
    tasks.finish(carols, "completed", result={})
    bobs = tasks.open("bob", "run_tests")
    assert bobs is not None
    # Alice holds the most: her oldest finished task goes; her running one and carol's stay.
    assert [tasks.get("alice", r.task_id) for r in alices if r is not None] == [
        alices[0],
        None,
        alices[2],
    ]
    assert tasks.get("carol", carols.task_id) is carols
    assert len(tasks) == 4


def test_the_server_wide_bound_never_evicts_a_running_task_or_a_smaller_share(
    clock: Clock,
) -> None:
    tasks = store(clock, per_sandbox=5, total=4)
    running = [tasks.open("alice", "run_tests") for _ in range(3)]
    assert all(record is not None for record in running)
    bobs = tasks.open("bob", "run_tests")
    assert bobs is not None
    tasks.finish(bobs, "completed", result={})
    # Alice's tasks all run; bob's one finished task is no larger a share than carol's would be.
    assert tasks.open("carol", "run_tests") is None
    assert tasks.get("bob", bobs.task_id) is bobs
    clock.now += 61  # once bob's expires there is room again
    assert tasks.open("carol", "run_tests") is not None


def test_tasks_expire_in_the_order_they_finished(clock: Clock) -> None:
    tasks = store(clock, keep_s=60)
    slow, quick = tasks.open("alice", "run_tests"), tasks.open("alice", "run_tests")
    assert slow is not None
    assert quick is not None
    tasks.finish(quick, "completed", result={})
    clock.now += 30
    tasks.finish(slow, "completed", result={})
    clock.now += 30
    assert tasks.expire() == 1
    assert tasks.get("alice", quick.task_id) is None
    assert tasks.get("alice", slow.task_id) is slow
    clock.now += 30
    assert tasks.expire() == 1
    assert len(tasks) == 0


def test_a_look_up_costs_little_with_the_store_full(clock: Clock) -> None:
    tasks = store(clock, keep_s=60, per_sandbox=100_000, total=100_000)
    for _ in range(100_000):
        record = tasks.open("alice", "run_tests")
        assert record is not None
        tasks.finish(record, "completed", result={})
    # The fastest of 1,000 look-ups: a scan of the 100,000 tasks is slow on every one.
    assert fastest(lambda: tasks.get("bob", "no-such-task"), runs=1000) < 0.001


def test_an_open_costs_little_with_the_store_full_of_single_tasks(clock: Clock) -> None:
    # The worst case of the search for a larger share: every key holds one finished task.
    tasks = store(clock, keep_s=3600, per_sandbox=20, total=2000)
    for n in range(2000):
        record = tasks.open(f"sandbox-{n}", "run_tests")
        assert record is not None
        tasks.finish(record, "failed", message="NOT_FOUND")

    def refused() -> None:
        assert tasks.open("alice", "run_tests") is None  # no share larger than hers would be

    assert fastest(refused, runs=100) < 0.002  # about 60 µs here
