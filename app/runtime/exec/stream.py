"""Reading an ``exec start`` stream without losing what came with its answer.

``exec start`` answers ``101 UPGRADED`` and then writes the command's output, as
frames, on the same connection. ``http.client`` reads the answer's headers through
a buffered reader, up to 8 KiB per read: when the headers and the first frames are
on the socket together (the thread that reads the answer came late: a loaded
machine, a busy interpreter), those frames land in that reader's buffer. docker-py
then reads the raw socket beneath it (``_get_raw_response_socket``), and the frames
are lost (docker/docker-py#3332, open in 7.x): a command that printed a line and
exited 0 came back with exit code 0 and no output, and without W's announcement
(its first frame), so it could not have been killed either.

Here a stream is read through that buffered reader (what it holds first, then the
socket), and the fast path's executor stream takes what it holds before it reads
the socket itself.
"""

from __future__ import annotations

import contextlib
import io
import socket
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import docker
from docker.types import CancellableStream
from docker.utils.socket import demux_adaptor, frames_iter

if TYPE_CHECKING:
    DemuxedStream = CancellableStream[tuple[bytes | None, bytes | None]]

_HEADER = struct.Struct(">BxxxL")
_CHUNK = 1 << 16


def exec_stream(api: docker.APIClient, exec_id: str) -> DemuxedStream:
    """Start the exec; its output as ``(stdout, stderr)`` chunks, as docker-py's
    ``exec_start(stream=True, demux=True)`` gives them, none lost (blocking)."""
    sock: Any = api.exec_start(exec_id, socket=True)
    response: Any = getattr(sock, "_response", None)
    reader = _reader_of(response)
    if reader is None:  # not the connection docker-py makes on Linux: read as it does
        frames = frames_iter(sock, False)  # type: ignore[no-untyped-call]
        return CancellableStream((demux_adaptor(*frame) for frame in frames), response)
    # The engine client's timeout is for calls, not for a command's silences.
    _raw(sock).settimeout(None)
    return CancellableStream(_frames(reader), response)


def close_stream(stream: DemuxedStream) -> None:
    """Shut the stream's socket (a blocked read returns) and release its response.

    ``CancellableStream.close`` only shuts the socket while the response is
    open, and never closes the response, whose socket is then left to the
    garbage collector (a ResourceWarning).
    """
    with contextlib.suppress(OSError):
        stream.close()
    response = getattr(stream, "_response", None)
    if response is not None:
        with contextlib.suppress(OSError):
            response.close()


def read_ahead(sock: object) -> bytes:
    """What the HTTP parser read past the answer of ``exec_start(socket=True)`` (the
    stream's first bytes, to be read before the socket's own; blocking socket)."""
    reader = _reader_of(getattr(sock, "_response", None))
    if reader is None:
        return b""
    raw = _raw(sock)
    timeout = raw.gettimeout()
    raw.setblocking(False)  # only the buffer: nothing more is waited for
    try:
        return reader.read1(_CHUNK) or b""
    finally:
        raw.settimeout(timeout)


def _frames(reader: io.BufferedReader) -> Iterator[tuple[bytes | None, bytes | None]]:
    while True:
        header = reader.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return
        kind, length = _HEADER.unpack(header)
        while length > 0:
            data = reader.read1(min(length, _CHUNK))
            if not data:
                return
            length -= len(data)
            yield demux_adaptor(kind, data)


def _reader_of(response: object) -> io.BufferedReader | None:
    """The buffered reader ``http.client`` parsed the answer with, if that is what it is."""
    reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    return reader if isinstance(reader, io.BufferedReader) else None


def _raw(sock: object) -> socket.socket:
    """The socket beneath docker-py's ``SocketIO`` (or the socket itself)."""
    raw = getattr(sock, "_sock", sock)
    assert isinstance(raw, socket.socket)
    return raw
