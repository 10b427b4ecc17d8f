"""A full task store makes room from the largest share: a hundred sandboxes' finished
tasks do not keep another tenant's long call out of the store for an hour.

A finished task counts toward MAX_TASKS (2000) for TASK_KEEP_S (3600 s). An
execute_experiment on a made-up experiment id opens a task and ends it at once
(NOT_FOUND), so 100 sandboxes (five addresses' SANDBOXES_PER_ADDRESS, within
NEW_SANDBOXES_PER_HOUR) fill the store in seconds. At the bound, a new task evicts the
oldest finished task of the sandbox holding the most (TaskStore.open), so the next
tenant's long call still gets a task (clients that rely on tasks give up on a call
served on the line after about a minute).
"""

from __future__ import annotations

from app.mcp.tasks.store import TaskStore
from app.settings.mcp import McpSettings


class Clock:
    now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_finished_tasks_of_many_sandboxes_do_not_lock_the_store_for_an_hour() -> None:
    settings, clock = McpSettings(), Clock()
    tasks = TaskStore(
        keep_s=settings.task_keep_s,
        max_per_sandbox=settings.max_tasks_per_sandbox,
        max_total=settings.max_tasks,
        clock=clock,
    )
    sandboxes = settings.max_tasks // settings.max_tasks_per_sandbox
    for s in range(sandboxes):
        for _ in range(settings.max_tasks_per_sandbox):
            record = tasks.open(f"mallory-{s}", "execute_experiment")
            assert record is not None
            tasks.finish(record, "failed", message="NOT_FOUND")  # ended at once
    clock.now += 60  # a minute later: all of them finished, none expired
    assert len(tasks) == settings.max_tasks
    alices = tasks.open("alice", "execute_experiment")
    assert alices is not None, (
        f"{sandboxes} sandboxes' finished tasks keep alice's long call out of the store "
        f"for {settings.task_keep_s} s"
    )
    assert len(tasks) == settings.max_tasks  # one finished task made room, no more
