"""The executor's stderr is tenant-controlled: only its first frames reach the
server's log (the rest are counted), however many the tenant writes.

Code in the sandbox runs as the executor's uid and can write to its stderr
(``/proc/<executor>/fd/2``, the docker exec's stderr pipe; the threat model in
app/runtime/exec/protocol.py grants it the stdin and stdout already). Each docker stream
frame of kind 2 became one ``fast_exec.stderr`` log line (Session._read), on the
loop, however many arrived: a tenant writing one byte at a time filled the server's
log (host disk) and held the loop for the rendering of every line.
"""

from __future__ import annotations

import asyncio
import socket
import struct

from structlog.testing import capture_logs

from app.runtime.exec.protocol import Session

FRAMES = 20_000


def _frame(data: bytes, kind: int) -> bytes:
    return struct.pack(">BxxxL", kind, len(data)) + data


async def test_a_flood_of_executor_stderr_frames_is_logged_a_bounded_number_of_times() -> None:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    session = Session("c" * 64, ours, None)
    flood = b"".join(_frame(b"x", kind=2) for _ in range(FRAMES))  # 180 KB
    with capture_logs() as logs:
        session.start_reading(b"")
        theirs.sendall(flood)
        theirs.shutdown(socket.SHUT_WR)  # the stream ends once the flood is read
        async with asyncio.timeout(20):
            while session.alive:  # noqa: ASYNC110 - a property, polled within the bound
                await asyncio.sleep(0.05)
    logged = sum(1 for e in logs if e["event"] == "fast_exec.stderr")
    session.close("test")
    theirs.close()
    # 180 KB of tenant bytes should cost the server's log a bounded number of lines
    # (a rate limit, or a summary), not one line per frame.
    assert logged <= 100, f"{logged} log lines for {FRAMES} one-byte stderr frames"
