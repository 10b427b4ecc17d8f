"""Review 6, finding 4: a hundred sandboxes' finished tasks keep every other tenant's
long calls out of the task store for an hour.

A finished task counts toward MAX_TASKS (2000) for TASK_KEEP_S (3600 s), and only
its own sandbox's next task ever evicts it (TaskStore.open). An execute_experiment
on a made-up experiment id opens a task and ends it at once (NOT_FOUND), so 100
sandboxes (five addresses' SANDBOXES_PER_ADDRESS, within NEW_SANDBOXES_PER_HOUR) fill
the store in seconds; for the next hour every other tenant's long command is served
without a task (README: "past it, the call is served without a task"), where clients
that rely on tasks give up on it after about a minute.
"""

from __future__ import annotations

from app.mcp.task_store import TaskStore
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
    assert tasks.open("alice", "execute_experiment") is not None, (
        f"{sandboxes} sandboxes' finished tasks keep alice's long call out of the store "
        f"for {settings.task_keep_s} s"
    )
