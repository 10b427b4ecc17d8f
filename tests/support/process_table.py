"""A container's process table as the runtime's integration tests read it, with the
fast path's executor told apart exactly.

The executor is a ``docker exec`` of its own: its parent is outside the container's
pid namespace, so ``ps`` shows it with parent 0. It starts each job with
``subprocess.Popen`` (``vfork`` then ``execve``): between the two the child still
shows the executor's command line, with the executor as its parent. A loaded CI run
caught such a child while a test's ``ps`` ran beside a starting job, and a count of
lines naming "smcp-executor" took it for a second executor (issue 27). A second
executor would have parent 0 as well; that one is a leak, and is still refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.runtime.exec.sessions import AGENT_ARGV

# The only ``ps`` format the tests use: each line "PID PPID ARGS".
PS = "ps -eo pid=,ppid=,args="
EXECUTOR_ARGS = " ".join(AGENT_ARGV)


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    args: str


@dataclass(frozen=True)
class Table:
    """One ``ps`` snapshot: the executor (None on ``docker exec``), the jobs it was
    starting (forked, not executed yet) and every other process."""

    executor: Process | None
    starting: list[Process]
    rest: list[Process]


def parse(stdout: str) -> list[Process]:
    processes = []
    for line in stdout.splitlines():
        pid, ppid, *args = line.split(None, 2)
        processes.append(Process(int(pid), int(ppid), args[0] if args else ""))
    return processes


def split(processes: list[Process], *, fast: bool) -> Table:
    """The snapshot split as above; fails unless there is exactly one executor on the
    fast path (none on ``docker exec``) and every other process showing its command
    line is a child of it (a job it is starting)."""
    ours = [p for p in processes if p.args == EXECUTOR_ARGS]
    executors = [p for p in ours if p.ppid == 0]
    assert len(executors) == (1 if fast else 0), processes
    executor = executors[0] if executors else None
    starting = [p for p in ours if p.ppid != 0]
    assert executor is not None or not starting, processes
    assert all(executor is not None and p.ppid == executor.pid for p in starting), processes
    rest = [p for p in processes if p.args != EXECUTOR_ARGS]
    return Table(executor, starting, rest)
