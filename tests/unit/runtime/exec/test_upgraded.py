"""Reading an upgraded answer's stream: nothing the header parse read ahead is lost.

The engine is played by one end of a socket pair; the other end is parsed by
``http.client`` as docker-py's transport parses it (the real-engine case is in
tests/integration/runtime/test_exec_output_race.py).
"""

from __future__ import annotations

import concurrent.futures
import http.client
import socket
import struct
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from app.runtime.exec.stream import _frames, _reader_of, read_ahead

ANSWER = b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n"


def frame(kind: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", kind, len(data)) + data


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    client, engine = socket.socketpair()
    client.settimeout(5)
    yield client, engine
    for answer in _answers:
        answer.close()  # its reader holds the socket open
    _answers.clear()
    client.close()
    engine.close()


_answers: list[http.client.HTTPResponse] = []


def parsed(client: socket.socket) -> Any:
    """The socket docker-py's ``exec_start(socket=True)`` returns, its response attached."""
    answer = http.client.HTTPResponse(client)
    _answers.append(answer)
    answer.begin()
    response = SimpleNamespace(raw=SimpleNamespace(_fp=answer))
    sock = answer.fp.raw  # type: ignore[union-attr]
    sock._response = response
    return sock


def test_frames_sent_with_the_answer_are_all_read(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    client, engine = pair
    first = frame(1, b"12345 12346\n") + frame(1, b"hi\n") + frame(2, b"err\n")
    engine.sendall(ANSWER + first + frame(1, b"spl"))  # one write: one read takes it all
    sock = parsed(client)
    reader = _reader_of(sock._response)
    assert reader is not None
    chunks = _frames(reader)
    assert [next(chunks) for _ in range(4)] == [
        (b"12345 12346\n", None),
        (b"hi\n", None),
        (None, b"err\n"),
        (b"spl", None),
    ]
    later = frame(1, b"it across writes")
    engine.sendall(later[:5])
    engine.sendall(later[5:])
    engine.shutdown(socket.SHUT_WR)
    assert b"".join(out or b"" for out, _ in chunks) == b"it across writes"


def test_read_ahead_takes_the_buffer_and_never_waits(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    client, engine = pair
    client.settimeout(None)  # blocking: a read that waited for the silent peer never returns
    engine.sendall(ANSWER + frame(2, b"early"))
    sock = parsed(client)
    assert read_ahead(sock) == frame(2, b"early")
    # Nothing buffered, a silent peer: no wait. Run aside, so a read that waited fails the
    # generous join instead of a clock bound that a busy machine could miss.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as aside:
        second = aside.submit(read_ahead, sock)
        try:
            assert second.result(timeout=30) == b""
        finally:
            if not second.done():
                engine.shutdown(socket.SHUT_WR)  # end its wait, so the thread can be joined
    assert client.gettimeout() is None  # the socket is as it was
    engine.sendall(b"next")
    assert client.recv(10) == b"next"


def test_read_ahead_of_a_bare_socket_is_nothing(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    assert read_ahead(pair[0]) == b""
