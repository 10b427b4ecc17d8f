"""Metrics: event counting, the scrape when the database is down, content negotiation."""

from __future__ import annotations

import io

import structlog
from starlette.requests import Request

from app.errors import DatabaseUnavailable
from app.http.metrics import Metrics, MetricsEndpoint
from app.observability import configure_logging
from pool.leases import PoolStats


def request(accept: str | None = None, authorization: str | None = None) -> Request:
    headers = []
    if accept:
        headers.append((b"accept", accept.encode()))
    if authorization:
        headers.append((b"authorization", authorization.encode()))
    return Request({"type": "http", "method": "GET", "path": "/metrics", "headers": headers})


def test_events_are_counted_even_below_the_log_level() -> None:
    metrics = Metrics()
    configure_logging("WARNING", stream=io.StringIO(), count_events=metrics.count_event)
    try:
        log = structlog.get_logger("test")
        log.info("unit.happened")
        log.info("unit.happened")
        log.warning("unit.refused", reason="x")
    finally:
        configure_logging("INFO", stream=io.StringIO())
    body, _ = metrics.render(None)
    text = body.decode()
    assert 'sandbox_mcp_events_total{event="unit.happened",level="info"} 2.0' in text
    assert 'sandbox_mcp_events_total{event="unit.refused",level="warning"} 1.0' in text


async def test_a_scrape_with_the_database_down_still_answers_and_says_so() -> None:
    async def down() -> PoolStats:
        raise DatabaseUnavailable("connection refused")

    response = await MetricsEndpoint(Metrics(), down, None).handle(request())
    assert response.status_code == 200
    assert b"sandbox_mcp_database_up 0.0" in response.body


async def test_the_scraper_gets_the_format_it_asks_for_and_a_wrong_token_nothing() -> None:
    async def stats() -> PoolStats:
        return PoolStats(size=5, busy=2, free=3, reserved=0, queued=1, oldest_wait_s=4.5)

    endpoint = MetricsEndpoint(Metrics(), stats, "t" * 20)
    assert (await endpoint.handle(request(authorization="Bearer " + "u" * 20))).status_code == 401
    plain = await endpoint.handle(request(authorization="Bearer " + "t" * 20))
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    for line in (
        b"sandbox_mcp_pool_size 5.0",
        b"sandbox_mcp_pool_busy 2.0",
        b"sandbox_mcp_pool_free 3.0",
        b"sandbox_mcp_pool_reserved 0.0",
        b"sandbox_mcp_pool_queued 1.0",
        b"sandbox_mcp_pool_oldest_wait_seconds 4.5",
        b"sandbox_mcp_database_up 1.0",
    ):
        assert line in plain.body.splitlines(), line
    open_metrics = await endpoint.handle(
        request("application/openmetrics-text; version=1.0.0", "Bearer " + "t" * 20)
    )
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
    assert open_metrics.body.rstrip().endswith(b"# EOF")


def test_a_line_of_repeats_not_written_counts_as_those_events() -> None:
    """Repeated warnings are written a few times a minute and the rest told as one
    count (issue 23): the counter still holds every event."""
    metrics = Metrics()
    configure_logging("INFO", stream=io.StringIO(), count_events=metrics.count_event)
    try:
        log = structlog.get_logger("test")
        log.warning("unit.refused", reason="x")
        log.warning("unit.refused", repeats_not_written=41, in_s=60)
    finally:
        configure_logging("INFO", stream=io.StringIO())
    body, _ = metrics.render(None)
    assert 'sandbox_mcp_events_total{event="unit.refused",level="warning"} 42.0' in body.decode()
