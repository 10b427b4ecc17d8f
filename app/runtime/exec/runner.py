"""Commands in a running container, on either path: ``docker exec`` (its output read
as it comes) or the container's executor (:mod:`app.runtime.exec.protocol`); the job's
timeout and cancel, and its kill (:mod:`app.runtime.exec.kill`) when it times out, is
cancelled or its stream breaks, so no command ever runs on unobserved.

See :mod:`app.runtime.exec.process_tree` for how a command announces its process group and
how the killer finds every process of it.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio
import docker
import structlog

if TYPE_CHECKING:
    from docker.types import CancellableStream

from app.errors import InvalidArgument
from app.runtime.backend import WORKSPACE, ExecResult
from app.runtime.docker.engine_errors import translated
from app.runtime.docker.threads import Offload
from app.runtime.errors import ContainerGone, ExecutorStopped, RuntimeUnavailable
from app.runtime.exec.kill import TreeKiller
from app.runtime.exec.process_tree import (
    Announcement,
    CappedBuffer,
    Exec,
    ExecTable,
    job_argv,
)
from app.runtime.exec.protocol import ExecutorLost, Session
from app.runtime.exec.sessions import Executors
from app.runtime.exec.stream import close_stream, exec_stream

log = structlog.get_logger(__name__)

_STILL_RUNNING_LOOKS = 10
# Told the pids (T, W) of a job's process tree once it announced them.
OnStart: TypeAlias = Callable[[tuple[int, int]], Awaitable[None]]
# Generic only in the type stubs.
_Stream: TypeAlias = "CancellableStream[tuple[bytes | None, bytes | None]]"


class ExecRunner:
    """Runs commands in containers through ``docker exec`` and kills them when asked."""

    def __init__(
        self,
        *,
        api: Callable[[], Awaitable[docker.APIClient]],
        offload: Offload,
        user: str,
        kill_grace_s: float,
        fast: Executors | None = None,
    ) -> None:
        self._api = api
        self._fast = fast
        self._offload = offload
        self._user = user
        self._kill_grace_s = kill_grace_s
        self._jobs = ExecTable()
        self._killer = TreeKiller(api=api, offload=offload, user=user, fast=fast)
        # Results so far, by the path that ran them (for tests and benchmarks).
        self.runs: collections.Counter[str] = collections.Counter()

    async def run(
        self,
        container_id: str,
        command: str,
        *,
        timeout_s: float,
        job_id: str,
        max_output_bytes: int,
        env: dict[str, str] | None,
        on_start: OnStart | None = None,
    ) -> ExecResult:
        """Run ``command`` to its end, its timeout or its cancel; its result.
        ``on_start`` is told the pids of the job's process tree once it announced them
        (so another process can kill it: ``kill_tree``)."""
        timeout = timeout_s
        job = self._jobs.add(container_id, job_id)
        if job is None:
            raise InvalidArgument(f"A job {job_id!r} is already running in this container.")
        started = time.monotonic()
        session = await self._fast.session_soon(container_id) if self._fast is not None else None
        try:
            if session is not None:
                exit_code, stdout, stderr = await self._run_fast(
                    session, job, command, timeout, max_output_bytes, env, on_start
                )
            else:
                exit_code, stdout, stderr = await self._run_exec(
                    job, command, timeout, max_output_bytes, env, on_start
                )
        finally:
            job.settled.set()
            self._jobs.discard(job)
        self.runs["fast" if session is not None else "docker-exec"] += 1
        duration = time.monotonic() - started
        # The guard sets "timeout" only if the job had not finished at its deadline, so
        # it timed out even when the killer then found it already dying (a fork bomb's
        # processes can exit under the kill before the killer looks).
        killed = job.reason == "timeout" or (job.reason is not None and job.was_running)
        result = ExecResult(
            exit_code=None if killed else exit_code,
            stdout=stdout.text(),
            stderr=stderr.text(),
            stdout_truncated=stdout.truncated,
            stderr_truncated=stderr.truncated,
            duration_s=round(duration, 3),
            timed_out=killed and job.reason == "timeout",
            cancelled=killed and job.reason == "cancel",
        )
        log.info(
            "runtime.run",
            container_id=container_id[:12],
            job_id=job_id,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            cancelled=result.cancelled,
            ms=round(duration * 1000),
        )
        return result

    async def _run_exec(
        self,
        job: Exec,
        command: str,
        limit_s: float,
        max_output_bytes: int,
        env: dict[str, str] | None,
        on_start: OnStart | None,
    ) -> tuple[int | None, CappedBuffer, CappedBuffer]:
        """The ``docker exec`` path: one exec per command, its stream read here."""
        container_id = job.container_id
        stdout, stderr = CappedBuffer(max_output_bytes), CappedBuffer(max_output_bytes)
        stream: _Stream | None = None
        try:
            api = await self._api()
            with translated(container_id):
                exec_id: str = (
                    await self._offload.call(
                        api.exec_create,
                        container_id,
                        job_argv(command),
                        stdout=True,
                        stderr=True,
                        user=self._user,
                        workdir=WORKSPACE,
                        environment=env or None,
                    )
                )["Id"]
                stream = await self._offload.call(_start_stream, api, exec_id)
            guard = functools.partial(self._guard, api, job, stream, limit_s)
            async with self._supervised(job, guard):
                with translated(container_id):
                    await self._drain(stream, job, stdout, stderr, on_start)
            close_stream(stream)
            with translated(container_id):
                exit_code = await self._offload.call(_exit_code, api, exec_id)
                if job.reason is None and (exit_code is None or exit_code >= 128):
                    # Killed by a signal: by the command's own doing, or because its
                    # container stopped under it (the engine stopping or restarting),
                    # which is no outcome of the command's.
                    await self._offload.call(_require_running, api, container_id)
        except BaseException:
            if stream is not None:
                close_stream(stream)
            await self._kill_unobserved(job)
            raise
        return exit_code, stdout, stderr

    async def _run_fast(
        self,
        session: Session,
        job: Exec,
        command: str,
        limit_s: float,
        max_output_bytes: int,
        env: dict[str, str] | None,
        on_start: OnStart | None,
    ) -> tuple[int | None, CappedBuffer, CappedBuffer]:
        """The fast path: the container's executor runs the same job (app.runtime.exec.protocol)."""
        container_id = job.container_id
        try:
            request_id = await session.submit(job_argv(command), env, max_output_bytes)
        except ExecutorLost as exc:
            await self._require_running(container_id)
            raise RuntimeUnavailable("the sandbox's command executor stopped") from exc
        pending = session.pending(request_id)
        job.fast_kill = functools.partial(session.kill, request_id)
        try:
            async with self._supervised(
                job, functools.partial(self._guard_fast, session, job, limit_s)
            ):
                await pending.announced.wait()
                job.pids = pending.pids
                job.announced.set()
                if on_start is not None and job.pids is not None and not pending.done.is_set():
                    await on_start(job.pids)
                await pending.done.wait()
                job.eof = pending.result is not None
            if pending.result is None and job.reason is not None and job.pids is not None:
                # Killed on purpose, and the executor went away meanwhile (the kill
                # fell back to docker exec): the outcome stands, its output is lost.
                return None, CappedBuffer(max_output_bytes), CappedBuffer(max_output_bytes)
            if pending.result is None:
                # The executor went away under the job (killed, crashed, a garbled
                # stream) or could not start it: as when a docker exec stream breaks.
                await self._require_running(container_id)
                if pending.error is not None:
                    raise RuntimeUnavailable(f"the command could not start: {pending.error}")
                raise ExecutorStopped(session.why)
            exit_code, stdout, stderr = pending.result
            if job.reason is None and exit_code >= 128:
                await self._require_running(container_id)  # as on the docker exec path
        except BaseException:
            # Until T and W are gone too, as when the job is cancelled.
            await self._kill_unobserved(job, settled=pending.done.wait)
            raise
        finally:
            session.forget(request_id)
        return exit_code, stdout, stderr

    @contextlib.asynccontextmanager
    async def _supervised(
        self, job: Exec, guard: Callable[[], Coroutine[Any, Any, None]]
    ) -> AsyncIterator[None]:
        """The skeleton both paths share: the guard (timeout, cancel) runs beside the
        body, and the job's events are set however the body ends."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(guard)
            try:
                yield
            finally:
                job.finished.set()
                job.announced.set()
                job.stop.set()

    async def _kill_unobserved(
        self, job: Exec, settled: Callable[[], Awaitable[object]] | None = None
    ) -> None:
        """Cancelled from outside, or the stream broke: never leave the command running
        unobserved (shielded, at most 30 s; ``settled`` awaited within the kill grace)."""
        if job.pids is not None and not job.eof and not job.was_running:
            with anyio.CancelScope(shield=True), anyio.move_on_after(30):
                await self._killer.kill(job)
                if settled is not None:
                    with anyio.move_on_after(self._kill_grace_s):
                        await settled()

    async def _guard_fast(self, session: Session, job: Exec, limit_s: float) -> None:
        """Kill the job on timeout or cancel; drop an executor that then never answers."""
        with anyio.move_on_after(limit_s):
            await job.stop.wait()
        if job.finished.is_set():
            return
        if job.reason is None:
            job.reason = "timeout"
        job.was_running = await self._killer.kill(job)
        with anyio.move_on_after(self._kill_grace_s):
            await job.finished.wait()
            return
        log.warning("runtime.executor_stuck", container_id=job.container_id[:12], job_id=job.job_id)
        session.close("no answer after a kill")

    async def _require_running(self, container_id: str) -> None:
        api = await self._api()
        with translated(container_id):
            await self._offload.call(_require_running, api, container_id)

    # -- the fast path's executors (app.runtime.exec.protocol) ------------------------------

    def prepare(self, container_id: str) -> None:
        """Start the container's executor in the background (no-op on docker exec only)."""
        if self._fast is not None:
            self._fast.prepare(container_id)

    def docker_exec_only(self, container_id: str) -> None:
        """Run this container's commands through docker exec (a short-lived helper)."""
        if self._fast is not None:
            self._fast.docker_exec_only(container_id)

    def forget(self, container_id: str) -> None:
        """The container is being removed: drop its executor."""
        if self._fast is not None:
            self._fast.forget(container_id)

    async def fast_ready(self, container_id: str) -> bool:
        """Wait until the container's executor is ready; False if it has none."""
        return self._fast is not None and await self._fast.ready(container_id) is not None

    async def aclose(self) -> None:
        if self._fast is not None:
            await self._fast.aclose()

    async def cancel(self, container_id: str, job_id: str) -> bool:
        """Kill a running job's process tree and wait for it to settle; False if none."""
        job = self._jobs.get(container_id, job_id)
        if job is None or job.finished.is_set():
            return False
        if job.reason is None:
            job.reason = "cancel"
        job.stop.set()
        with anyio.move_on_after(self._kill_grace_s + 60):
            await job.settled.wait()
        return True

    async def kill_all(self, container_id: str) -> None:
        """Kill every process of the sandbox user in the container but its keep-alive,
        never through its executor (:meth:`app.runtime._kill.TreeKiller.kill_all`)."""
        await self._killer.kill_all(container_id)

    async def kill_tree(self, container_id: str, pids: tuple[int, int]) -> bool:
        """Kill the process tree of a job this process does not run (another server
        process does, or did), given the pids it announced; True if it was running."""
        job = Exec(container_id, "elsewhere", pids=pids)
        job.announced.set()
        return await self._killer.kill_quietly(job)

    async def _drain(
        self,
        stream: _Stream,
        job: Exec,
        stdout: CappedBuffer,
        stderr: CappedBuffer,
        on_start: OnStart | None,
    ) -> None:
        announcement = Announcement()
        async for out, err in self._offload.iterate(stream):
            if out:
                stdout.add(announcement.feed(out))
                if announcement.done and not job.announced.is_set():
                    job.pids = announcement.pids
                    job.announced.set()
                    if on_start is not None and job.pids is not None:
                        await on_start(job.pids)
            if err:
                stderr.add(err)
        stdout.add(announcement.flush())
        job.eof = True

    async def _guard(
        self, api: docker.APIClient, job: Exec, stream: _Stream, limit_s: float
    ) -> None:
        """Kill the job on timeout or cancel; unblock the reader if output never ends."""
        with anyio.move_on_after(limit_s):
            await job.stop.wait()
        if job.finished.is_set():
            return
        if job.reason is None:
            job.reason = "timeout"
        job.was_running = await self._killer.kill_quietly(job, api)
        with anyio.move_on_after(self._kill_grace_s):
            await job.finished.wait()
            return
        log.warning("runtime.stream_stuck", container_id=job.container_id[:12], job_id=job.job_id)
        with contextlib.suppress(OSError):
            stream.close()  # only the socket: the reader thread still holds the response


def _start_stream(api: docker.APIClient, exec_id: str) -> _Stream:
    # Not docker-py's exec_start(stream=True): it loses output read with the answer.
    return exec_stream(api, exec_id)


def _exit_code(api: docker.APIClient, exec_id: str) -> int | None:
    """The exit code of an exec whose output has ended.

    The engine records the code before it closes the output, so the first look
    normally has it; a few more looks cover an engine that does it the other way.
    """
    for _ in range(20):
        inspected = api.exec_inspect(exec_id)
        code = inspected.get("ExitCode")
        if code is not None or not inspected.get("Running"):
            return None if code is None else int(code)
        time.sleep(0.05)
    return None


def _require_running(api: docker.APIClient, container_id: str) -> None:
    """Raise ContainerGone if the container stopped. The engine may record a command's
    end before its container's (both die when the container's init does), so a
    container is watched for a second before it is believed running."""
    for _ in range(_STILL_RUNNING_LOOKS):
        if not api.inspect_container(container_id).get("State", {}).get("Running"):
            raise ContainerGone(container_id)
        time.sleep(0.1)
