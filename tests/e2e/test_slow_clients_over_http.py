"""Slowloris: half-sent requests must not starve the server of descriptors.

Seen: 1,100 connections that each sent a partial request line and held made
the server hit its 1,024-descriptor limit; ``/health`` stopped answering.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from e2e_server import RunningServer, Servers, start_server, stop_server

pytestmark = pytest.mark.e2e

HALF_SENT = 1_100
# Bounds a busy machine meets and a broken server does not: /health answers in
# milliseconds, or not before the slow clients are evicted (the 10 s default header
# timeout); a connection is closed at its deadline plus scheduling, not at the 10 s
# and 60 s defaults a server ignoring the settings would use.
HEALTH_S = 5.0
HEADER_S, BODY_S = 1, 2
SLACK_S = 3
PARTIAL = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
# Headers complete, then a body that never arrives (the app waits for it).
PARTIAL_BODY = (
    b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b'Accept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{"jsonrpc"'
)


@contextlib.contextmanager
def half_sent_requests(
    server: RunningServer, count: int, partial: bytes = PARTIAL
) -> Iterator[list[socket.socket]]:
    """``count`` loopback connections that each sent part of a request and hold it."""
    host, port = server.base_url.removeprefix("http://").split(":")
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection((host, int(port)), timeout=5)
            with contextlib.suppress(OSError):  # the server may already have closed it
                sock.sendall(partial)
            opened.append(sock)
        yield opened
    finally:
        for sock in opened:
            sock.close()


def health_answers_within(server: RunningServer, seconds: float) -> float:
    started = time.monotonic()
    response = httpx2.get(f"{server.base_url}/health", timeout=seconds)
    elapsed = time.monotonic() - started
    assert response.status_code in (200, 503), response.text
    assert elapsed < seconds
    return elapsed


def soft_nofile(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files line")


@pytest.fixture
def capped_server(serve: Servers) -> RunningServer:
    # Soft and hard limit 1,024, as a default systemd unit: nothing to raise.
    return serve(nofile=(1024, 1024))


@pytest.mark.parametrize("partial", [PARTIAL, PARTIAL_BODY], ids=["headers", "body"])
def test_health_answers_while_1100_half_sent_requests_hold(
    capped_server: RunningServer, partial: bytes
) -> None:
    assert soft_nofile(capped_server.process.pid) == 1024
    with half_sent_requests(capped_server, HALF_SENT, partial):
        for _ in range(3):
            health_answers_within(capped_server, HEALTH_S)
    assert "Too many open files" not in capped_server.log()
    assert "http.slow_client_evicted" in capped_server.log()


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one(tmp_path: Path) -> None:
    running = start_server(tmp_path / "state", nofile=(1024, 8192))
    try:
        assert soft_nofile(running.process.pid) == 8192
        with half_sent_requests(running, HALF_SENT):
            health_answers_within(running, HEALTH_S)
        assert "http.slow_client_evicted" not in running.log()  # 1,100 fit under the cap
    finally:
        stop_server(running)


def test_a_client_slower_than_the_header_timeout_is_disconnected(tmp_path: Path) -> None:
    running = start_server(
        tmp_path / "state",
        SANDBOX_MCP_HEADER_TIMEOUT_S=str(HEADER_S),
        SANDBOX_MCP_BODY_TIMEOUT_S=str(BODY_S),
    )
    try:
        for partial, deadline in ((PARTIAL, HEADER_S), (PARTIAL_BODY, BODY_S)):
            with half_sent_requests(running, 3, partial) as socks:
                started = time.monotonic()
                for sock in socks:
                    sock.settimeout(deadline + 2 * SLACK_S)
                    assert sock.recv(100) == b""  # closed, no response
                assert time.monotonic() - started < deadline + SLACK_S
        # A kept-alive connection gets the same deadline for its next request.
        with socket.create_connection(("127.0.0.1", int(running.base_url.rsplit(":", 1)[1]))) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            s.settimeout(5)
            assert s.recv(4096).startswith(b"HTTP/1.1 ")
            s.sendall(PARTIAL)
            started = time.monotonic()
            while s.recv(4096):
                pass
            assert time.monotonic() - started < HEADER_S + SLACK_S
        health_answers_within(running, HEALTH_S)
    finally:
        stop_server(running)
