"""The fast exec path: one persistent executor per container, no ``docker exec`` per command.

``docker exec`` costs an engine round trip per command (create, start, the stream,
inspect: about 57 ms here). Instead, each server process starts one executor in each
experiment container it runs commands in (:mod:`app.runtime.exec.agent`, stdlib
Python) as a single long-lived ``docker exec`` with stdin attached, and keeps its
hijacked stream: requests go down it as JSON lines, results come back on it,
multiplexed by request id. So:

* **no network and no socket into the host**: the stream is the Docker API
  connection the server already has; the container gets nothing new (no mount, no
  port, no file: the agent's source is sent over its stdin and runs from memory);
* **owned by the server**: it is started by the server (at create, warm containers
  included, or lazily at a container's first command in this process) and lives as
  long as the stream: when this process goes away the stream closes, the executor
  reads the end of its stdin, kills every job's tree and exits;
* **the same promises**: a job is the very ``job_argv`` of the ``docker exec`` path
  (tini as a subreaper, the supervisor W, the command in its own session), run as the
  same user, in ``/workspace``, with the environment ``docker exec`` would give (the
  container's, the executor's own exec's defaults, and the request's ``env`` on top),
  under the same container limits; W announces ``T W`` as before (``on_start`` gets
  them, so any process can still kill the tree with the ``docker exec`` killer, which
  accepts a T whose parent is an executor); output is capped by the same rule
  (first quarter, last three quarters) and rendered by the same ``CappedBuffer``;
  the exit code is T's (128 + signal when killed, as ``docker exec`` reports).
  Timeouts and cancels ask the executor to kill the tree (the same algorithm as the
  shell killer, in Python, without a fork); if it does not answer, the ``docker
  exec`` killer (and its last resort, the container restart) does it.

**Fallback**: a command goes through ``docker exec`` when the container has no
ready executor (still starting: a new container's first command waits up to
``FIRST_COMMAND_WAIT_S`` for it; no ``/usr/bin/python3`` in the image, a container
this process has not started one in yet, a clone helper) or the setting
``exec_path`` is ``docker-exec``. A dead executor (killed, crashed, a broken or
garbled stream) is dropped at once: the commands it was running are killed through
``docker exec`` and reported lost with the reason (``ExecutorStopped``: their result
is lost, as when a ``docker exec`` stream breaks), later ones go through ``docker
exec`` while a new executor starts in the background; after ``MAX_STARTS`` executors that each died
young (a crash loop, or a sandbox that keeps killing them) a container stays on
``docker exec``. An executor that never answers after a kill (its job's supervisor
stopped, say) is dropped too: its stdin closes and it kills every job it runs, so
nothing runs on unobserved.

**Threat model.** Code in the sandbox runs as the executor's uid, in its
container: it can kill the executor or start another, ``ptrace`` it, open its stdin,
stdout and stderr through ``/proc/PID/fd`` and write requests, forged answers or
floods of anything, or (through the container's environment, e.g. ``LD_PRELOAD``)
load code into it or replace it. So the executor's stream is tenant input, read as
such; none of that gains the tenant anything it does not already have:

* the executor has no privilege the sandbox lacks (same uid and groups, no
  capability, ``no-new-privileges``, the same cgroup, namespaces and seccomp
  filter), no network and no host socket, so it cannot be a stepping stone;
* the stream never holds the event loop: it is read in chunks of ``_CHUNK`` with
  a pass through the loop after each, at most ``EVENTS_PER_S`` frames and lines,
  ``BYTES_PER_S`` bytes and ``READS_PER_S`` reads a second (past that it is read
  more slowly: the executor's writes, the tenant's own, wait), and only bounded
  lines are parsed on the loop (larger ones are decoded in a worker thread);
* every line must be an answer the server is owed: an id it never issued, a
  second end, an unasked "killed", a line longer than the request's caps allow,
  anything not an answer, or more than ``STDERR_MAX`` bytes on stderr is a broken
  stream: the session is closed at once (its jobs are killed through ``docker
  exec`` and reported lost with the reason, ``ExecutorStopped``), so a flood of
  lines costs the server one chunk, and one line that never ends is cut at the caps;
  only the first ``STDERR_LOGGED`` stderr frames reach the log;
* what the server reads is treated as tenant output, exactly like a command's own
  stdout on the ``docker exec`` path (which a command controls anyway): validated
  (ids, pids, exit codes, base64 sizes within the caps); a forged exit code or
  output can only lie about the tenant's own commands in the tenant's own
  container, which the tenant could already do (a command can print anything and
  exit with any code);
* forged pids make the server kill processes of that container's user, which the
  tenant can already do; the ``docker exec`` killer keeps its checks;
* a dead, silent, slow or replaced executor costs the tenant its own running
  commands (killed, reported lost) and the speed-up, never the kill: every kill
  falls back to ``docker exec``, whose killer runs outside the executor's reach (a
  fresh exec), and an executor that does not answer after a kill is dropped.

The executor costs the container one process (a pid of its pids limit) and about
12 MB of resident memory, 6 MB of it its own (the rest the interpreter's pages,
shared), counted in the container's memory limit; an idle executor sleeps in
``select`` (no wake-ups).

This module holds the stream protocol (:class:`Session`: requests out, answers in);
:mod:`app.runtime.exec.sessions` starts the executors and keeps them by container.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import anyio
import structlog

from app.runtime.backend import WORKSPACE
from app.runtime.exec.process_tree import CappedBuffer
from app.runtime.exec.throttle import Throttle

log = structlog.get_logger(__name__)

ExecPath = Literal["auto", "docker-exec"]
EXEC_PATHS: Final = ("auto", "docker-exec")
START_TIMEOUT_S: Final = 15.0
KILL_ANSWER_S: Final = 5.0  # a kill the executor does not answer in time falls back
_LARGE_LINE: Final = 64 * 1024  # decoded in a worker thread from this size on
_CHUNK: Final = 64 * 1024  # read per step; the loop runs everything else between steps
# What one executor's stream may cost a second (the threat model). An honest executor
# sends a few lines per command and a result of at most three times its cap, in frames
# of kilobytes: far below. Past them the stream is read more slowly, not dropped.
EVENTS_PER_S: Final = 8192  # frames and lines
BYTES_PER_S: Final = 64 * 1024 * 1024
# Each read is a pass of the reader on the loop (about 16 us of the server's CPU)
# whatever it holds: one-byte frames written just under EVENTS_PER_S woke it 8192
# times a second, 13% of a core for each trickling sandbox. An honest result (up to
# three times its cap: a few MB) is a few dozen full chunks, within the burst.
READS_PER_S: Final = 256
# The executor's stderr is the tenant's to write (/proc/PID/fd/2): only its first
# frames reach the server's log, the rest are counted (one line when the stream ends);
# an honest executor writes there only a traceback as it dies, so more is a flood.
STDERR_LOGGED: Final = 20
STDERR_MAX: Final = 64 * 1024
FRAME_HEADER = struct.Struct(">BxxxL")

# Why a session was closed, in the words the agent reads (ExecutorStopped): stable.
UNASKED: Final = (
    "it sent an answer to a request the server never made or that was already answered "
    "(something in the sandbox wrote to the executor's stdout)"
)
OVERSIZED: Final = "it sent an answer longer than the output caps allow"
GARBLED: Final = "it sent a line that is not a valid answer"
STDERR_FLOOD: Final = f"it wrote more than {STDERR_MAX // 1024} KiB to its stderr"
ENDED: Final = "it exited or was killed (by a process in the sandbox, or a limit)"


class StreamBroken(ValueError):
    """The executor's stream broke the protocol; the message is one of the whys above."""


class ExecutorLost(Exception):
    """The executor went away (or broke the protocol) while a request was pending.
    ``at_start``: it exited before it was ready (the image cannot run it)."""

    def __init__(self, reason: str, *, at_start: bool = False) -> None:
        super().__init__(reason)
        self.at_start = at_start


@dataclass(eq=False)
class _Pending:
    cap: int
    pids: tuple[int, int] | None = None
    announced: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    result: tuple[int, CappedBuffer, CappedBuffer] | None = None
    error: str | None = None
    killed: asyncio.Future[bool | None] | None = None
    kills: int = 0  # kill requests sent and not answered yet

    def owed(self) -> int:
        """How many more answers the executor may still send for this request."""
        return (not self.announced.is_set()) + (not self.done.is_set()) + self.kills


class Session:
    """One executor's stream: requests out, answers in (see the module doc)."""

    def __init__(self, container_id: str, sock: socket.socket, keep: object) -> None:
        self.container_id = container_id
        self._sock = sock
        self._keep = keep  # the SDK's socket wrapper and response: closed with us
        self._send_lock = asyncio.Lock()
        self._pending: dict[int, _Pending] = {}
        # Answers still owed for requests forgotten before the executor was done with
        # them (a timed-out job's end, a late "killed"), and their caps: one each.
        self._owed: dict[int, tuple[int, int]] = {}
        self._next_id = 0
        self.alive = True
        self.why = ENDED  # why it went away, for the agent (one of the whys above)
        self.served = 0
        self._born = time.monotonic()
        self._died: float | None = None
        self._reader: asyncio.Task[None] | None = None
        self._stderr_frames = 0
        self._stderr_bytes = 0

    def lived_s(self) -> float:
        return (self._died or time.monotonic()) - self._born

    def start_reading(self, leftover: bytes) -> None:
        self._reader = asyncio.create_task(self._read(leftover), name="fast-exec-reader")

    # -- requests ----------------------------------------------------------------------

    async def submit(self, argv: list[str], env: dict[str, str] | None, cap: int) -> int:
        """Start a job; its request id. Raises ExecutorLost."""
        self._next_id += 1
        request_id = self._next_id
        self._pending[request_id] = _Pending(cap=cap)
        message = {
            "op": "run",
            "id": request_id,
            "argv": argv,
            "env": env or {},
            "cwd": WORKSPACE,
            "cap": cap,
        }
        await self._send(message)
        self.served += 1
        return request_id

    def pending(self, request_id: int) -> _Pending:
        return self._pending[request_id]

    def forget(self, request_id: int) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is not None and pending.owed():
            self._owed[request_id] = (pending.owed(), pending.cap)

    async def kill(self, request_id: int) -> bool | None:
        """Have the executor kill the job's tree: True if it was running, None if the
        executor did not answer (dead, silent): the caller must fall back."""
        pending = self._pending.get(request_id)
        if pending is None or not self.alive:
            return None
        pending.killed = asyncio.get_running_loop().create_future()
        pending.kills += 1
        try:
            await self._send({"op": "kill", "id": request_id})
            with anyio.move_on_after(KILL_ANSWER_S):
                return await asyncio.shield(pending.killed)
        except ExecutorLost:
            pass
        return None

    async def _send(self, message: dict[str, Any]) -> None:
        if not self.alive:
            raise ExecutorLost("the executor is gone")
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        loop = asyncio.get_running_loop()
        try:
            async with self._send_lock:
                with anyio.fail_after(START_TIMEOUT_S):
                    await loop.sock_sendall(self._sock, data)
        except (OSError, TimeoutError) as exc:
            self.close(f"send failed: {exc}")
            raise ExecutorLost(str(exc)) from exc

    # -- answers -----------------------------------------------------------------------

    async def _read(self, buffered: bytes) -> None:
        loop = asyncio.get_running_loop()
        frames = bytearray(buffered)
        lines = bytearray()
        scanned = 0  # how much of ``lines`` holds no newline (never scanned twice)
        events, volume, reads = (
            Throttle(EVENTS_PER_S),
            Throttle(BYTES_PER_S),
            Throttle(READS_PER_S),
        )
        received = len(buffered)
        reason = "the stream ended"
        try:
            while True:
                # Offsets, and one deletion per read: a long answer arrives in many
                # frames, and shifting the buffer per frame would hold the loop.
                pos = count = 0
                while len(frames) - pos >= FRAME_HEADER.size:
                    kind, length = FRAME_HEADER.unpack_from(frames, pos)
                    end = pos + FRAME_HEADER.size + length
                    if len(frames) < end:
                        break
                    count += 1
                    if kind == 1:
                        lines += frames[pos + FRAME_HEADER.size : end]
                    else:
                        self._stderr(frames, pos + FRAME_HEADER.size, end)
                    pos = end
                del frames[:pos]
                start = 0
                while (newline := lines.find(b"\n", max(start, scanned))) >= 0:
                    count += 1
                    await self._dispatch(bytes(lines[start:newline]))
                    start = newline + 1
                if start:
                    del lines[:start]
                scanned = len(lines)
                if len(lines) > self._line_limit():
                    raise StreamBroken(OVERSIZED)
                # The stream is the tenant's: whatever it sends, the loop runs everything
                # else between two chunks (sock_recv does not suspend while data waits),
                # and a session past its rates waits its turn.
                await asyncio.sleep(max(events.take(count), volume.take(received), reads.take(1)))
                chunk = await loop.sock_recv(self._sock, _CHUNK)
                if not chunk:
                    break
                received = len(chunk)
                frames += chunk
        except asyncio.CancelledError:
            reason = "closed"
            raise
        except StreamBroken as exc:
            self.why, reason = str(exc), f"protocol broken: {exc}"
        except (ValueError, KeyError, TypeError, RecursionError, binascii.Error) as exc:
            self.why, reason = GARBLED, f"protocol broken: {exc!r}"[:300]
        except OSError as exc:
            reason = f"the stream failed: {exc}"
        finally:
            self.close(reason)

    def _stderr(self, frames: bytearray, start: int, end: int) -> None:
        self._stderr_frames += 1
        self._stderr_bytes += end - start
        if self._stderr_bytes > STDERR_MAX:
            raise StreamBroken(STDERR_FLOOD)
        if self._stderr_frames <= STDERR_LOGGED:
            log.info(
                "fast_exec.stderr",
                container_id=self.container_id[:12],
                text=bytes(frames[start : min(end, start + 500)]).decode("utf-8", "replace"),
            )

    def _line_limit(self) -> int:
        caps = [p.cap for p in self._pending.values()] + [c for _, c in self._owed.values()]
        return 3 * max(caps, default=0) + 4096

    async def _dispatch(self, line: bytes) -> None:
        if len(line) > _LARGE_LINE:
            message = await anyio.to_thread.run_sync(json.loads, line)
        else:
            message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError("not an object")
        request_id = message["id"]
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            raise ValueError("bad id")
        pending = self._pending.get(request_id)
        if pending is None:
            # Forgotten meanwhile: the answers still owed are taken (and dropped);
            # anything else was never asked for (a forgery, a flood).
            owed, cap = self._owed.pop(request_id, (0, 0))
            if not owed:
                raise StreamBroken(UNASKED)
            if owed > 1:
                self._owed[request_id] = (owed - 1, cap)
            return
        if "pids" in message:
            pids = message["pids"]
            if pending.announced.is_set():
                raise StreamBroken(UNASKED)
            if not _pids(pids):
                raise ValueError("bad pids")
            pending.pids = (pids[0], pids[1])
            pending.announced.set()
        elif "killed" in message:
            if not pending.kills:
                raise StreamBroken(UNASKED)
            pending.kills -= 1
            if pending.killed is not None and not pending.killed.done():
                pending.killed.set_result(bool(message["killed"]))
        elif pending.done.is_set() and ("error" in message or "code" in message):
            raise StreamBroken(UNASKED)
        elif "error" in message:
            pending.error = str(message["error"])[:500]
            pending.announced.set()
            pending.done.set()
        elif "code" in message:
            code = message["code"]
            if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255:
                raise ValueError("bad exit code")
            if len(line) > _LARGE_LINE:
                out, err = await anyio.to_thread.run_sync(_buffers, message, pending.cap)
            else:
                out, err = _buffers(message, pending.cap)
            pending.result = (code, out, err)
            pending.announced.set()
            pending.done.set()
        else:
            raise ValueError("unknown answer")

    def close(self, reason: str) -> None:
        """Drop the stream (idempotent): the executor sees its stdin end, kills its
        jobs' trees and exits; pending requests learn it is gone."""
        if not self.alive:
            return
        self.alive = False
        self._died = time.monotonic()
        log.info(
            "fast_exec.closed",
            container_id=self.container_id[:12],
            reason=reason,
            stderr_frames_not_logged=max(0, self._stderr_frames - STDERR_LOGGED),
        )
        close_raw_stream(self._sock, self._keep)
        for pending in self._pending.values():
            pending.announced.set()
            pending.done.set()
            if pending.killed is not None and not pending.killed.done():
                pending.killed.set_result(None)
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()


def _pids(value: object) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(p, int) and not isinstance(p, bool) and 0 < p < 1 << 22 for p in value)
    )


def _buffers(message: dict[str, Any], cap: int) -> tuple[CappedBuffer, CappedBuffer]:
    return _buffer(message["out"], cap), _buffer(message["err"], cap)


def _buffer(parts: object, cap: int) -> CappedBuffer:
    if not (isinstance(parts, list) and len(parts) == 3 and isinstance(parts[2], int)):
        raise ValueError("bad output")
    head = base64.b64decode(parts[0], validate=True)
    tail = base64.b64decode(parts[1], validate=True)
    return CappedBuffer.restored(cap, head, tail, parts[2])


def close_raw_stream(sock: socket.socket, wrapper: object) -> None:
    """Shut and close the hijacked socket and what the SDK wraps it in (the socket's
    descriptor is only released once its ``SocketIO`` is closed too)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
    for keep in (wrapper, getattr(wrapper, "_response", None)):
        close = getattr(keep, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()


def raw_socket(wrapper: object) -> socket.socket | None:
    raw = getattr(wrapper, "_sock", wrapper)
    if type(raw) is socket.socket:
        return raw
    return None
