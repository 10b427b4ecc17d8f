"""Whole reads and writes by offset on an open descriptor.

``os.pread`` and ``os.pwrite`` may move fewer bytes than asked (a signal, a pipe, a
large count); the copier and the baseline pack both need all of them, by offset, without
moving the descriptor's own position (another thread may share it)."""

from __future__ import annotations

import os


def read_whole(fd: int, size: int) -> bytes:
    """Up to ``size`` bytes from the start (fewer if the file shrank; growth is not read)."""
    pieces: list[bytes] = []
    at = 0
    while at < size:
        piece = os.pread(fd, size - at, at)
        if not piece:
            break
        pieces.append(piece)
        at += len(piece)
    return b"".join(pieces)


def write_whole(fd: int, data: bytes, at: int = 0) -> None:
    """All of ``data`` at offset ``at``."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, at)
        view, at = view[written:], at + written
