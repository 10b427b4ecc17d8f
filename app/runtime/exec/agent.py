"""The in-container executor: runs the server's commands without a ``docker exec`` each.

Stdlib only, Python 3.8+; it never touches the container's filesystem: the server
sends this file's source over the executor's stdin and it runs from memory
(see :mod:`app.runtime.exec.protocol`, which also holds the threat model).

Protocol: one JSON object per line, both ways. In (stdin):

    {"op": "run", "id": N, "argv": [...], "env": {...}, "cwd": "/workspace", "cap": BYTES}
    {"op": "kill", "id": N}

Out (stdout): ``{"ready": PID}`` once, then per job ``{"id": N, "pids": [T, W]}`` once
W announced them, ``{"id": N, "code": C, "out": [HEAD, TAIL, OMITTED], "err": [...]}``
at its end (HEAD and TAIL base64, capped as the server's ``CappedBuffer`` caps), or
``{"id": N, "error": "..."}`` if it could not start; ``{"id": N, "killed": BOOL}``
answers a kill (True: it was running and its tree is dead now).

A job's argv is the server's ``job_argv`` (tini as a subreaper, the supervisor W,
the command in its own session): its process tree and the kill are exactly those
of the ``docker exec`` path, the kill only done here, without a fork (so it works
when the job holds every pid the container may have). When stdin ends (the server
went away) every job's tree is killed before the executor exits: nothing runs on
unobserved.
"""

from __future__ import annotations

import base64
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any

NAME = "smcp-executor"  # the kill check in app.runtime.exec.process_tree knows T's parent by it
_ANNOUNCEMENT_MAX = 32
_KILL_ROUNDS = 400
_LINE_MAX = 8 * 1024 * 1024  # a request bigger than this is a broken stream


class Capped:
    """The first quarter and the last three quarters of at most ``cap`` bytes."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 4
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.omitted = 0

    def add(self, chunk: bytes) -> None:
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail += chunk
        excess = len(self.tail) - self.tail_cap
        if excess > 0:
            del self.tail[:excess]
            self.omitted += excess

    def parts(self) -> list[Any]:
        return [_b64(self.head), _b64(self.tail), self.omitted]


def _b64(data: bytes | bytearray) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


class RunningCommand:
    def __init__(self, job_id: int, proc: subprocess.Popen[bytes], cap: int) -> None:
        self.id = job_id
        self.proc = proc
        self.out = Capped(cap)
        self.err = Capped(cap)
        self.head = bytearray()  # stdout until W's announcement line is complete
        self.announced = False
        self.pids: tuple[int, int] | None = None
        self.open = 2  # pipes not at EOF yet
        self.status: int | None = None  # exit code once T is reaped
        self.ended_at = 0.0
        self.lock = threading.Lock()  # T is not reaped while a kill runs
        self.pidfd: int | None = None


class Agent:
    def __init__(self) -> None:
        self.jobs: dict[int, RunningCommand] = {}
        self.selector = selectors.DefaultSelector()
        self.write_lock = threading.Lock()
        self.stdin = sys.stdin.buffer
        self.inbox = bytearray()

    def send(self, message: dict[str, Any]) -> None:
        line = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self.write_lock:
            os.write(1, line) if len(line) < 4096 else _write_all(line)

    # -- requests --------------------------------------------------------------------

    def run(self, request: dict[str, Any]) -> None:
        job_id = request["id"]
        env = dict(os.environ)
        env.update(request.get("env") or {})
        try:
            proc = subprocess.Popen(  # noqa: S603 - the server's job_argv
                request["argv"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=request.get("cwd") or None,
                env=env,
                close_fds=True,
            )
        except (OSError, ValueError, TypeError) as exc:  # a NUL byte is a ValueError
            self.send({"id": job_id, "error": str(exc)})
            return
        job = RunningCommand(job_id, proc, int(request.get("cap", 1 << 20)))
        self.jobs[job_id] = job
        for pipe in (proc.stdout, proc.stderr):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            self.selector.register(pipe, selectors.EVENT_READ, (job, pipe is proc.stdout, pipe))
        try:
            job.pidfd = os.pidfd_open(proc.pid)
            self.selector.register(job.pidfd, selectors.EVENT_READ, (job, None, None))
        except (AttributeError, OSError):
            job.pidfd = None  # no pidfd (Python < 3.9, an old kernel): polled

    def kill(self, request: dict[str, Any]) -> None:
        job = self.jobs.get(request["id"])
        if job is None:
            self.send({"id": request["id"], "killed": False})
            return
        try:
            threading.Thread(target=self._kill_and_answer, args=(job,), daemon=True).start()
        except RuntimeError:
            # No thread to be had: the job holds every pid the container may have (a
            # fork bomb). Killing it here needs none.
            self._kill_and_answer(job)

    def _kill_and_answer(self, job: RunningCommand) -> None:
        self.send({"id": job.id, "killed": kill_job(job)})

    # -- output and ends ---------------------------------------------------------------

    def on_exit(self, job: RunningCommand) -> None:
        assert job.pidfd is not None
        self.selector.unregister(job.pidfd)
        os.close(job.pidfd)
        job.pidfd = None

    def on_output(self, job: RunningCommand, is_stdout: bool, pipe: IO[bytes]) -> None:
        try:
            chunk = os.read(pipe.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.selector.unregister(pipe)
            pipe.close()
            job.open -= 1
            if is_stdout and not job.announced:
                job.announced = True
                job.out.add(bytes(job.head))
            return
        if not is_stdout:
            job.err.add(chunk)
        elif job.announced:
            job.out.add(chunk)
        else:
            self.announce(job, chunk)

    def announce(self, job: RunningCommand, chunk: bytes) -> None:
        """Split W's first line ("T W") off the command's output, as ``Announcement`` does."""
        job.head += chunk
        line, newline, rest = bytes(job.head).partition(b"\n")
        if newline:
            job.announced = True
            words = line.split(b" ")
            if len(words) == 2 and all(w.isdigit() and w[:1] != b"0" for w in words):
                job.pids = (int(words[0]), int(words[1]))
                self.send({"id": job.id, "pids": list(job.pids)})
                job.out.add(rest)
            else:
                job.out.add(bytes(job.head))
        elif len(job.head) > _ANNOUNCEMENT_MAX:
            job.announced = True
            job.out.add(bytes(job.head))

    def reap(self) -> None:
        now = time.monotonic()
        for job in list(self.jobs.values()):
            if job.status is None and job.pidfd is None and job.lock.acquire(blocking=False):
                try:
                    code = job.proc.poll()
                finally:
                    job.lock.release()
                if code is not None:
                    # Killed by a signal: the code docker exec reports (128 + signal).
                    job.status = 128 - code if code < 0 else code
                    job.ended_at = now
            if job.status is None:
                continue
            if job.open and now - job.ended_at > 2:
                # T is gone yet something holds its pipes: stop reading, as the
                # docker exec path closes a stuck stream.
                for key in list(self.selector.get_map().values()):
                    if key.data is not None and key.data[0] is job and key.data[1] is not None:
                        self.selector.unregister(key.fileobj)
                        key.data[2].close()
                job.open = 0
            if not job.open:
                del self.jobs[job.id]
                self.send(
                    {
                        "id": job.id,
                        "code": job.status,
                        "out": job.out.parts(),
                        "err": job.err.parts(),
                    }
                )

    def on_stdin(self) -> bool:
        chunk = os.read(0, 65536)
        if not chunk:
            return False
        self.inbox += chunk
        while b"\n" in self.inbox:
            line, _, rest = bytes(self.inbox).partition(b"\n")
            self.inbox = bytearray(rest)
            request = json.loads(line)
            if request.get("op") == "run":
                self.run(request)
            elif request.get("op") == "kill":
                self.kill(request)
        return len(self.inbox) <= _LINE_MAX

    def serve(self) -> None:
        os.set_blocking(0, False)
        self.selector.register(0, selectors.EVENT_READ, None)
        self.send({"ready": os.getpid()})
        while True:
            polled = any(j.pidfd is None and j.status is None for j in self.jobs.values())
            stuck = any(j.status is not None for j in self.jobs.values())
            timeout = 0.02 if polled else 0.5 if stuck else None
            for key, _ in self.selector.select(timeout):
                if key.data is None:
                    try:
                        if not self.on_stdin():
                            return
                    except BlockingIOError:
                        pass
                elif key.data[1] is None:
                    self.on_exit(key.data[0])
                else:
                    self.on_output(*key.data)
            self.reap()

    def shutdown(self) -> None:
        for job in list(self.jobs.values()):
            kill_job(job)


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(1, view) :]
        except BlockingIOError:
            time.sleep(0.001)


def kill_job(job: RunningCommand) -> bool:
    """Kill the job's tree (``_KILL_TREE`` of app.runtime.exec.process_tree, in Python: no fork);
    True if it was still running. T is ours and not reaped meanwhile, so its pid is
    not recycled under the kill."""
    with job.lock:
        if job.proc.returncode is not None or job.pids is None:
            return False
        root, supervisor = job.pids
        if root != job.proc.pid:
            return False
        return kill_tree(root, supervisor)


def kill_tree(root: int, supervisor: int) -> bool:
    me = os.getpid()
    for _ in range(_KILL_ROUNDS):
        hit = False
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid in (supervisor, me):
                continue
            state, parent = _status(pid)
            if state in ("", "Z", "X") or parent not in (root, supervisor):
                continue
            for target in (-pid, pid):
                try:
                    os.kill(target, signal.SIGKILL)
                    hit = hit or target > 0
                except OSError:
                    pass
        if not hit:
            return True
        time.sleep(0.02)
    return True


def _status(pid: int) -> tuple[str, int]:
    state, parent = "", 0
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for raw in status:
                key, _, value = raw.partition(b":")
                if key == b"State":
                    state = value.split()[0].decode() if value.split() else ""
                elif key == b"PPid":
                    parent = int(value.strip() or 0)
                    break
    except (OSError, ValueError):
        pass
    return state, parent


def main() -> None:
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(NAME)
    except OSError:
        pass
    agent = Agent()
    try:
        agent.serve()
    finally:
        agent.shutdown()


if __name__ == "__main__":
    main()
