"""Killing a job's process tree: through its executor when it has one and answers,
else through the ``docker exec`` killer (retried), and as the last resort a restart of
the container (a fork bomb can hold every pid the killer would need).

Killing every process of the sandbox user in a container (the dir slots' disk budget,
:func:`TreeKiller.kill_all`) never goes through the executor: the executor runs as the
sandbox user, so a tenant can stop or kill it, and the kill freezes and kills it too
(the server then saw the kill "lost" and left the writer running: issue 23, finding 6).
It is a ``docker exec`` of its own, retried, then the restart.

See :mod:`app.runtime.exec.process_tree` for how a command announces its process group and
how the killer finds every process of it; :mod:`app.runtime.exec.runner` decides when.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import docker
import structlog

from app.runtime.docker.engine_errors import translated
from app.runtime.docker.threads import Offload
from app.runtime.errors import ContainerGone, RuntimeFailure
from app.runtime.exec.process_tree import Exec, killer_argv
from app.runtime.exec.sessions import Executors

log = structlog.get_logger(__name__)

_KILLED, _NOT_RUNNING = 0, 3  # exit codes of the killer (app.runtime.exec.process_tree.KILLER)
_KILL_ATTEMPTS = 4
# Kills every process of the sandbox user in the container but the keep-alive (the
# lowest PID after tini's 1: it started first, no tenant process can come before
# it). Everything is frozen first (kill(-1) spares only PID 1 and the caller), so
# nothing forks while the list is walked; then the keep-alive is thawed. The
# container's executor is a process of the sandbox user like any other: killed too.
KILL_ALL = (
    "kill -STOP -1 2>/dev/null; "
    "pids=$(ls /proc | grep -E '^[0-9]+$' | sort -n); keep=$(echo \"$pids\" | sed -n 2p); "
    'for p in $pids; do [ "$p" -gt 1 ] && [ "$p" != "$keep" ] && [ "$p" != "$$" ] '
    '&& kill -KILL "$p" 2>/dev/null; done; kill -CONT "$keep" 2>/dev/null; true'
)


class TreeKiller:
    """Kills jobs' process trees in containers; never raises."""

    def __init__(
        self,
        *,
        api: Callable[[], Awaitable[docker.APIClient]],
        offload: Offload,
        user: str,
        fast: Executors | None,
    ) -> None:
        self._api = api
        self._offload = offload
        self._user = user
        self._fast = fast

    async def kill(self, job: Exec) -> bool:
        """Kill the job's tree through its executor if it answers, else through docker
        exec; True if it was still running. Never raises."""
        if job.fast_kill is not None:
            with anyio.move_on_after(30):
                await job.announced.wait()
            if job.pids is None:
                return False
            answer = await job.fast_kill()
            if answer is not None:
                return answer
            log.info("runtime.executor_kill_fallback", job_id=job.job_id)
        return await self.kill_quietly(job)

    async def kill_quietly(self, job: Exec, api: docker.APIClient | None = None) -> bool:
        """Kill the job's process tree; True if it was still running. Never raises."""
        with anyio.move_on_after(30):
            await job.announced.wait()
        if job.pids is None:
            return False
        try:
            api = api or await self._api()
            for attempt in range(_KILL_ATTEMPTS):
                with translated(job.container_id):
                    code = await self._offload.call(
                        _exec_quietly,
                        api,
                        job.container_id,
                        killer_argv(*job.pids),
                        self._user,
                    )
                if code in (_KILLED, _NOT_RUNNING):
                    return code == _KILLED
                log.info("runtime.kill_retry", job_id=job.job_id, attempt=attempt, code=code)
                await anyio.sleep(0.2 * (attempt + 1))
            # The killer could not run or finish: the job holds every pid the
            # container may have (a fork bomb). Restarting the container kills
            # every process in it; the workspace stays, /tmp and home start empty.
            log.warning(
                "runtime.container_restarted",
                container_id=job.container_id[:12],
                job_id=job.job_id,
                reason="the job's process tree could not be killed from inside",
            )
            with translated(job.container_id):
                await self._offload.call(api.restart, job.container_id, timeout=0)
            if self._fast is not None:
                self._fast.forget(job.container_id)  # its executor died with the rest
        except ContainerGone:
            pass  # its processes went with it
        except RuntimeFailure:
            log.warning(
                "runtime.kill_failed",
                container_id=job.container_id[:12],
                job_id=job.job_id,
                exc_info=True,
            )
        return True

    async def kill_all(self, container_id: str) -> None:
        """Kill every process of the sandbox user in the container but its keep-alive,
        through a ``docker exec`` of its own (never the executor: see the module doc),
        retried when it fails (the engine answers 500 under load, or the exec cannot
        start: exit 126); when every try failed, the container is restarted (every
        process in it dies; the workspace stays, /tmp and home start empty).

        Raises:
            RuntimeFailure: CONTAINER_GONE (its processes went with it),
                RUNTIME_UNAVAILABLE (not even the restart could be done).
        """
        api = await self._api()
        argv = ["/bin/sh", "-c", KILL_ALL, "sandbox-mcp-kill-all"]
        for attempt in range(_KILL_ATTEMPTS):
            try:
                with translated(container_id):
                    code = await self._offload.call(
                        _exec_quietly, api, container_id, argv, self._user
                    )
            except ContainerGone:
                raise
            except RuntimeFailure as exc:
                code = str(exc)
            if code == 0:
                return
            log.info(
                "runtime.kill_all_retry", container_id=container_id[:12], attempt=attempt, code=code
            )
            await anyio.sleep(0.2 * (attempt + 1))
        log.warning(
            "runtime.container_restarted",
            container_id=container_id[:12],
            reason="its processes could not be killed from inside",
        )
        with translated(container_id):
            await self._offload.call(api.restart, container_id, timeout=0)
        if self._fast is not None:
            self._fast.forget(container_id)  # its executor died with the rest


def _exec_quietly(api: docker.APIClient, container_id: str, argv: list[str], user: str) -> object:
    """Run a short command of ours to completion; its exit code."""
    # Attached (and the output dropped): only an attached exec_start waits for the end.
    exec_id = api.exec_create(container_id, argv, stdout=True, stderr=True, user=user)["Id"]
    api.exec_start(exec_id)
    return api.exec_inspect(exec_id).get("ExitCode")
