"""The fast exec path's pieces without Docker: the executor's output caps against
``CappedBuffer``, the server's reading of the executor's answers (bounded, validated),
and the executor itself as a local process (run, announce, kill, end of stdin)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import struct
import subprocess
import sys
import time
from base64 import b64decode, b64encode

import pytest

from app.runtime.exec import agent
from app.runtime.exec.process_tree import CappedBuffer
from app.runtime.exec.protocol import (
    _CHUNK,
    EVENTS_PER_S,
    GARBLED,
    OVERSIZED,
    READS_PER_S,
    START_TIMEOUT_S,
    STDERR_FLOOD,
    STDERR_MAX,
    UNASKED,
    ExecutorLost,
    Session,
)
from app.runtime.exec.sessions import AGENT_ARGV, AGENT_SOURCE, _open_stream


@pytest.mark.parametrize("cap", [0, 1, 7, 100, 4096])
def test_the_executors_caps_render_exactly_as_the_servers(cap: int) -> None:
    rng = random.Random(cap)
    for _ in range(50):
        chunks = [os.urandom(rng.randrange(0, 300)) for _ in range(rng.randrange(0, 20))]
        theirs, ours = agent.Capped(cap), CappedBuffer(cap)
        for chunk in chunks:
            theirs.add(chunk)
            ours.add(chunk)
        head, tail, omitted = theirs.parts()
        restored = CappedBuffer.restored(cap, b64decode(head), b64decode(tail), omitted)
        assert restored.text() == ours.text()
        assert restored.truncated == ours.truncated


def test_parts_larger_than_their_cap_are_refused() -> None:
    with pytest.raises(ValueError, match="cap"):
        CappedBuffer.restored(8, b"abc", b"", 0)  # head cap is 2
    with pytest.raises(ValueError, match="cap"):
        CappedBuffer.restored(8, b"ab", b"1234567", 0)  # tail cap is 6
    with pytest.raises(ValueError, match="head"):
        CappedBuffer.restored(8, b"a", b"xy", 0)  # a tail before a full head


def _frame(data: bytes, kind: int = 1) -> bytes:
    return struct.pack(">BxxxL", kind, len(data)) + data


async def _session() -> tuple[Session, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    session = Session("c" * 64, ours, None)
    session.start_reading(b"")
    return session, theirs


async def _answer(theirs: socket.socket, message: object) -> None:
    theirs.sendall(_frame((json.dumps(message) + "\n").encode()))
    await asyncio.sleep(0.05)


async def test_answers_reach_their_request() -> None:
    session, theirs = await _session()
    request_id = await session.submit(["true"], {"A": "b"}, 16)
    sent = json.loads(theirs.recv(65536))
    assert sent == {
        "op": "run",
        "id": request_id,
        "argv": ["true"],
        "env": {"A": "b"},
        "cwd": "/workspace",
        "cap": 16,
    }
    pending = session.pending(request_id)
    await _answer(theirs, {"id": request_id, "pids": [10, 11]})
    assert pending.pids == (10, 11)
    await _answer(theirs, {"id": request_id, "code": 3, "out": ["aGk=", "", 0], "err": ["", "", 0]})
    assert pending.result is not None
    code, out, err = pending.result
    assert (code, out.text(), err.text()) == (3, "hi", "")
    session.close("test")
    theirs.close()


@pytest.mark.parametrize(
    "forged",
    [
        b"not json\n",
        b'{"id": 1, "pids": [1, "x"]}\n',
        b'{"id": 1, "pids": [0, 5]}\n',
        b'{"id": 1, "code": 300, "out": ["", "", 0], "err": ["", "", 0]}\n',
        b'{"id": 1, "code": 0, "out": ["!!", "", 0], "err": ["", "", 0]}\n',
        b'{"id": 1, "code": 0, "out": ["' + b"QUFB" * 10 + b'", "", 0], "err": ["", "", 0]}\n',
        b"x" * 200_000,  # a line longer than the caps allow, never ended
        b"[" * 60_000 + b"\n",  # nested past the decoder's recursion limit
        b'{"pids": [10, 11]}\n',  # no id
    ],
)
async def test_a_garbled_or_forged_answer_drops_the_executor(forged: bytes) -> None:
    session, theirs = await _session()
    request_id = await session.submit(["true"], None, 16)
    theirs.recv(65536)
    theirs.sendall(_frame(forged))
    pending = session.pending(request_id)
    async with asyncio.timeout(5):
        await pending.done.wait()
    assert pending.result is None
    assert not session.alive
    assert session.why in (GARBLED, OVERSIZED)
    theirs.close()


# -- the stream is tenant input: answers owed, bounds, the loop never held ---------------


def _code(request_id: int) -> dict[str, object]:
    return {"id": request_id, "code": 0, "out": ["", "", 0], "err": ["", "", 0]}


@pytest.mark.parametrize(
    "unasked",
    [
        [{"id": 987654321}],  # an id never issued (issue 23's flood, its first line)
        [{"id": 0, "killed": True}],
        [{"id": "{request}", "killed": True}],  # no kill was asked
        [{"id": "{request}", "pids": [10, 11]}, {"id": "{request}", "pids": [10, 11]}],
        ["{code}", "{code}"],  # a second end
    ],
    ids=["never-issued", "id-zero", "unasked-kill", "second-pids", "second-end"],
)
async def test_an_answer_never_asked_for_closes_the_session(unasked: list[object]) -> None:
    session, theirs = await _session()
    request_id = await session.submit(["true"], None, 16)
    theirs.recv(65536)
    pending = session.pending(request_id)
    other = await session.submit(["sleep", "9"], None, 16)  # still running: lost with it
    theirs.recv(65536)
    for message in unasked:
        text = json.dumps(message).replace('"{request}"', str(request_id))
        text = text.replace('"{code}"', json.dumps(_code(request_id)))
        theirs.sendall(_frame(text.encode() + b"\n"))
    async with asyncio.timeout(5):
        await session.pending(other).done.wait()
    assert not session.alive
    assert session.why == UNASKED
    assert session.pending(other).result is None
    del pending
    theirs.close()


async def test_answers_owed_to_a_forgotten_request_are_taken_once_each() -> None:
    """A job given up on (a timeout whose kill the executor answered late) still gets
    its announcement, its end (as long as its caps allow) and its kill's answer; one
    more is a broken stream."""
    session, theirs = await _session()
    request_id = await session.submit(["true"], None, 65536)
    theirs.recv(65536)
    killing = asyncio.create_task(session.kill(request_id))
    await asyncio.sleep(0.05)
    assert json.loads(theirs.recv(65536)) == {"op": "kill", "id": request_id}
    session.forget(request_id)
    full = [b64encode(b"h" * 16384).decode(), b64encode(b"t" * 49152).decode(), 5]
    await _answer(theirs, {"id": request_id, "pids": [10, 11]})
    assert session.alive
    # Its end, in frames of 16 KiB as the engine cuts them: a line of several chunks.
    end = (json.dumps({"id": request_id, "code": 0, "out": full, "err": full}) + "\n").encode()
    theirs.sendall(b"".join(_frame(end[i : i + 16384]) for i in range(0, len(end), 16384)))
    await asyncio.sleep(0.2)
    assert session.alive, session.why
    await _answer(theirs, {"id": request_id, "killed": True})
    assert session.alive
    killing.cancel()
    await _answer(theirs, {"id": request_id, "killed": True})
    assert not session.alive
    assert session.why == UNASKED
    theirs.close()


async def test_a_flood_of_stderr_past_its_bound_closes_the_session() -> None:
    session, theirs = await _session()
    request_id = await session.submit(["true"], None, 16)
    theirs.recv(65536)
    theirs.sendall(_frame(b"e" * 1000, kind=2) * (STDERR_MAX // 1000 + 1))
    async with asyncio.timeout(5):
        await session.pending(request_id).done.wait()
    assert not session.alive
    assert session.why == STDERR_FLOOD
    theirs.close()


async def test_a_stream_past_its_rate_is_read_more_slowly() -> None:
    """Frames past ``EVENTS_PER_S`` wait their turn: the answer behind five seconds'
    worth of one-byte frames is read no sooner than their excess over a second's
    burst allows (less the last chunk, read before its wait)."""
    session, theirs = await _session()
    request_id = await session.submit(["true"], None, 16)
    theirs.recv(65536)
    frames = 5 * EVENTS_PER_S
    flood = _frame(b"e", kind=2) * frames + _frame(b'{"id": 1, "pids": [10, 11]}\n')
    started = time.monotonic()
    sender = asyncio.create_task(asyncio.to_thread(theirs.sendall, flood))
    async with asyncio.timeout(30):
        await session.pending(request_id).announced.wait()
    took = time.monotonic() - started
    await sender
    print(f"\n{frames} frames and an answer read in {took:.2f} s at {EVENTS_PER_S}/s")
    assert session.alive
    last_chunk = _CHUNK // len(_frame(b"e", kind=2))
    assert took >= (frames - EVENTS_PER_S - last_chunk) / EVENTS_PER_S
    session.close("test")
    theirs.close()


async def test_a_stream_that_never_pauses_never_holds_the_loop() -> None:
    """Issue 23: ``sock_recv`` returns without suspending while data waits, so a
    stream that stays full ran its reader alone on the loop. A writer keeps it full
    (one-byte frames of an answer that never ends, within the caps); meanwhile the
    loop's other tasks must keep running: measured as the longest gap of a ticker
    that wants to run every 10 ms, against the flood's length."""
    session, theirs = await _session()
    await session.submit(["true"], None, 8 << 20)  # caps that allow a long line
    theirs.recv(65536)
    chunk = _frame(b"x") * 4096
    flood_s = 3.0

    def flood() -> int:
        sent, until = 0, time.monotonic() + flood_s
        with contextlib.suppress(OSError):
            while time.monotonic() < until:
                theirs.sendall(chunk)
                sent += len(chunk)
        return sent

    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    sent = await asyncio.to_thread(flood)
    ticker.cancel()
    longest = max(gaps, default=flood_s)
    print(f"\n{sent} bytes flooded in {flood_s} s; {len(gaps)} ticks, longest gap {longest:.3f} s")
    assert len(gaps) >= 10, gaps
    assert longest < flood_s / 3, f"the loop was held for {longest:.2f} s of a {flood_s} s flood"
    session.close("test")
    theirs.close()


class _OneExec:
    """The two engine calls ``_open_stream`` makes, over a socket pair."""

    def __init__(self, ours: socket.socket) -> None:
        self.ours = ours

    def exec_create(self, *args: object, **kwargs: object) -> dict[str, str]:
        return {"Id": "e"}

    def exec_start(self, *args: object, **kwargs: object) -> socket.socket:
        return self.ours


def test_a_flood_before_the_ready_line_fails_the_start_at_once() -> None:
    """The sandbox can write to a new executor's stdout before its ready line: what
    comes first is bounded in bytes too (each read parsed it all again), not only by
    the start's 15 s."""
    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(_frame(b"x" * 65536) * 2)  # no newline, then silence
        started = time.monotonic()
        with pytest.raises(ExecutorLost, match="no ready line"):
            _open_stream(_OneExec(ours), "c" * 64, "1000")  # type: ignore[arg-type]
        assert time.monotonic() - started < START_TIMEOUT_S / 3
    finally:
        ours.close()
        theirs.close()


# -- the executor as a local process -----------------------------------------------------

# A stand-in for the job argv (no tini on the test host): T is this shell, W its child
# that announces "T W" first, then a grandchild that runs on.
TREE = ["/bin/sh", "-c", """sh -c 'printf "%s %s\\n" "$PPID" "$$"; sleep 4545 & wait'"""]


class Local:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, *AGENT_ARGV[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self.process.stdin is not None
        self.process.stdin.write(AGENT_SOURCE)
        self.process.stdin.flush()
        assert "ready" in self.read()

    def send(self, message: object) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        self.process.stdin.flush()

    def read(self) -> dict[str, object]:
        assert self.process.stdout is not None
        message: dict[str, object] = json.loads(self.process.stdout.readline())
        return message

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return "State:\tZ" not in status.read()
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as status:
                    if f"\nPPid:\t{pid}\n" in status.read():
                        found.append(int(name))
            except FileNotFoundError:
                pass
    return found


def test_the_executor_runs_caps_and_kills_a_tree() -> None:
    local = Local()
    try:
        argv = ["/bin/sh", "-c", "echo abcdefgh; echo e >&2; exit 4"]
        local.send({"op": "run", "id": 1, "argv": argv, "env": {}, "cwd": "/", "cap": 4})
        end = local.read()
        assert end["code"] == 4
        assert end["out"] == ["YQ==", "Z2gK", 5]  # "a", 5 bytes left out, "gh\n"
        assert end["err"] == ["ZQ==", "Cg==", 0]  # "e", "\n"
        local.send({"op": "run", "id": 2, "argv": TREE, "env": {}, "cwd": "/", "cap": 64})
        pids = local.read()["pids"]
        assert isinstance(pids, list)
        _root, supervisor = pids
        deadline = time.monotonic() + 10
        while not _children(supervisor) and time.monotonic() < deadline:
            time.sleep(0.02)
        (sleeper,) = _children(supervisor)
        local.send({"op": "kill", "id": 2})
        answers = [local.read(), local.read()]
        assert {"id": 2, "killed": True} in answers
        assert not _alive(sleeper)
        local.send({"op": "kill", "id": 2})  # over: nothing to kill
        assert local.read() == {"id": 2, "killed": False}
    finally:
        local.close()


@pytest.mark.parametrize(
    "request_fields",
    [
        {"argv": ["/bin/sh", "-c", "echo a\x00b"]},  # Popen: ValueError (embedded null byte)
        {"argv": ["/bin/sh", "-c", "true"], "env": {"X": "a\x00b"}},
        {"argv": ["/no/such/program"]},  # OSError
    ],
    ids=["nul-in-argv", "nul-in-env", "missing-program"],
)
def test_a_request_that_cannot_start_is_answered_and_the_executor_serves_on(
    request_fields: dict[str, object],
) -> None:
    """Seen after the merge: one NUL byte in a command killed the executor with a
    traceback; the request is answered with its error, and the next one runs."""
    local = Local()
    try:
        local.send({"op": "run", "id": 1, "env": {}, "cwd": "/", "cap": 64, **request_fields})
        answer = local.read()
        assert answer["id"] == 1
        assert "error" in answer, answer
        local.send({"op": "run", "id": 2, "argv": ["/bin/sh", "-c", "echo ok"], "env": {}})
        assert local.read()["code"] == 0
    finally:
        local.close()


def test_when_its_stdin_ends_the_executor_kills_its_jobs_and_exits() -> None:
    local = Local()
    try:
        local.send({"op": "run", "id": 1, "argv": TREE, "env": {}, "cwd": "/", "cap": 64})
        pids = local.read()["pids"]
        assert isinstance(pids, list)
        supervisor = pids[1]
        deadline = time.monotonic() + 10
        while not _children(supervisor) and time.monotonic() < deadline:
            time.sleep(0.02)
        (sleeper,) = _children(supervisor)
        assert local.process.stdin is not None
        local.process.stdin.close()
        assert local.process.wait(timeout=10) == 0
        assert not _alive(sleeper)
    finally:
        local.close()


async def test_a_trickle_of_one_byte_frames_wakes_the_reader_at_most_reads_per_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each read is a pass of the reader on the loop whatever it holds: one-byte frames
    of an answer that never ends, written one by one just under ``EVENTS_PER_S``,
    woke it for each frame. Counted: the reads while ``frames`` trickle in."""
    loop = asyncio.get_running_loop()
    reads = 0
    real = loop.sock_recv

    async def counted(sock: socket.socket, size: int) -> bytes:
        nonlocal reads
        reads += 1
        return await real(sock, size)

    monkeypatch.setattr(loop, "sock_recv", counted)
    session, theirs = await _session()
    await session.submit(["true"], None, 8 << 20)  # caps that allow a long line
    theirs.recv(65536)
    frames = 8 * READS_PER_S * 3  # over about three seconds

    def trickle() -> float:
        started = time.monotonic()
        for sent in range(frames):
            theirs.sendall(_frame(b"x"))
            time.sleep(max(0.0, started + sent * 3 / frames - time.monotonic()))
        return time.monotonic() - started

    began = time.monotonic()
    took = await asyncio.to_thread(trickle)
    await asyncio.sleep(0.1)
    spent, counted_reads = time.monotonic() - began, reads
    print(f"\n{frames} one-byte frames in {took:.2f} s: {counted_reads} reads ({READS_PER_S}/s)")
    assert session.alive
    # A second's burst, then the rate, over all the time the reader had.
    assert counted_reads <= READS_PER_S * (spent + 1) + 2, f"{counted_reads} in {spent:.2f} s"
    session.close("test")
    theirs.close()
