"""Running a command, or the project's tests, in a caller's live experiment.

The one way a tool runs something: the experiment's state is checked (commands run only
in a live one), the timeout is clamped once, by the rule creation's setup commands share
(``ExperimentOptions.command_timeout``; its warning is shown to the agent), the command
goes to :class:`~app.experiments.commands.CommandRunner` (which records it), and the
call waits as long as it may: a synchronous call ``sync_wait_s``, a background one not
at all, one served as an MCP task to the end.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from app.experiments.commands import Command, CommandRunner, TestContext
from app.experiments.core.errors import InvalidTransition, ProjectSourceError, TestsNotDetected
from app.experiments.core.states import RUNNABLE, State
from app.experiments.core.store import ExperimentStore
from app.experiments.creation import COMMAND_TIMEOUT_KEY, forwarded_env
from app.experiments.evidence import project, testing
from app.experiments.evidence.testing import TestPlan
from app.experiments.options import ExperimentOptions
from app.experiments.views import JobView
from jail import CallContext


class Execution:
    """Runs commands and tests in experiments for their callers (see the module doc).

    Args:
        records: The experiments (the ownership check reads them).
        commands: Runs and records a command.
        options: The server's timeouts and environment policy.
        workspace: The host folder of a caller's live experiment (the manager's check).
    """

    def __init__(
        self,
        records: ExperimentStore,
        commands: CommandRunner,
        options: ExperimentOptions,
        workspace: Callable[[CallContext, str], Awaitable[Path]],
    ) -> None:
        self._records = records
        self._commands = commands
        self._options = options
        self._workspace = workspace

    def _timeout(self, requested: float | None, warnings: list[str]) -> float:
        """The command's wall clock, clamped (``ExperimentOptions.command_timeout``)."""
        timeout, warning = self._options.command_timeout(requested)
        if warning is not None:
            warnings.append(warning)
        return timeout

    async def run_tests(
        self,
        call: CallContext,
        experiment_id: str,
        command: str | None = None,
        *,
        timeout_s: float | None = None,
        until_done: bool = False,
    ) -> JobView:
        """Detect the runner (unless ``command`` says), run it, and parse its results."""
        workspace_dir = await self._workspace(call, experiment_id)
        plan: TestPlan | None = None
        if not command:
            facts = await call.in_thread(project.facts, workspace_dir)
            plan = testing.detect(facts)
            if plan is None:
                reasons = testing.explain(facts)
                raise TestsNotDetected(
                    "Could not tell how to run this project's tests"
                    + (f" ({'; '.join(reasons)})" if reasons else "")
                    + "; pass `command` (for example `python3 -m pytest`).",
                )
        view = await self.execute(
            call,
            experiment_id,
            command or (plan.command if plan else ""),
            kind="tests",
            timeout_s=timeout_s,
            tests=(workspace_dir, plan, call.in_thread),
            until_done=until_done,
        )
        if plan is not None:
            view.notes[:0] = plan.notes
        return view

    async def execute(
        self,
        call: CallContext,
        experiment_id: str,
        command: str,
        *,
        kind: str = "command",
        background: bool = False,
        timeout_s: float | None = None,
        env: Sequence[str] = (),
        tests: TestContext | None = None,
        until_done: bool = False,
    ) -> JobView:
        """Start the command and wait ``sync_wait_s`` for it (none with ``background``):
        past that it runs on as a job, even if this call is cancelled (a client that
        hung up keeps its command). With ``until_done`` (a call served as an MCP task,
        whose client polls instead of holding the line) the wait lasts to the command's
        end, and cancelling the call kills the command."""
        experiment = await self._records.get(call.sandbox_key, experiment_id)
        if experiment.state is State.CREATING:
            raise InvalidTransition(
                "The experiment is still being created (CREATING); call get_experiment "
                "until its state leaves CREATING, then run the command.",
                state=experiment.state.value,
            )
        if experiment.state not in RUNNABLE or experiment.container_id is None:
            raise InvalidTransition(
                f"The experiment is {experiment.state.value}; commands run only in a live "
                "experiment (create a new one).",
                state=experiment.state.value,
            )
        if not command.strip():
            raise ProjectSourceError("The command is empty.")
        call.project_map.invalidate()  # a command may change any file
        warnings: list[str] = []
        timeout = self._timeout(
            timeout_s or experiment.isolation.get(COMMAND_TIMEOUT_KEY), warnings
        )
        # A call that owns its command (an MCP task) waits to the end, and a cancelled
        # call kills it; any other waits at most the synchronous wait.
        owned = until_done and not background
        wait = None if owned else 0.0 if background else self._options.sync_wait_s
        row, finished = await self._commands.run(
            Command(
                call.sandbox_key,
                experiment,
                command,
                kind,
                timeout,
                forwarded_env(self._options, env),
                background,
            ),
            wait_s=wait,
            tests=tests,
        )
        job_id = row.job_id
        view = JobView.of(row)
        view.notes.extend(warnings)
        if not finished and not background:
            view.notes.append(
                f"The command is still running after {wait:g} s, so it continues in the "
                f"background (to its own timeout of {timeout:g} s). Poll get_job_status or "
                f"wait with get_job_result using job_id {job_id}."
            )
        return view
