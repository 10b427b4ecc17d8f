"""Prometheus ``/metrics``: the pool's gauges, tool calls, and one counter per log event.

Every operation already logs one structlog event (DESIGN, Observability), so
counting events by name gives a counter for each operation (sign-ins, code
exchanges, idle resets, refused client documents, ...) without threading a
metrics object through every module. Event names are constants in the code,
so the label's cardinality is bounded. Tool calls get a latency histogram of
their own. The pool's gauges are read at scrape time, like ``/health``.

Each ``Metrics`` has its own registry, so two servers in one process (tests)
never share counts.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.errors import DatabaseUnavailable
from pool.leases import PoolStats

# The runner's line for each call: counted by ``tool_call``, which hears of every call,
# not by ``count_event``, so a level that filters the line costs a call no log record.
TOOL_CALL_EVENT = "tool.call"
# Tool calls span file reads (milliseconds) to test runs (minutes).
_TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180, 600)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._events = Counter(
            "sandbox_mcp_events",
            "Log events by name and level: one per operation.",
            ["event", "level"],
            registry=self.registry,
        )
        self._tool_calls = Histogram(
            "sandbox_mcp_tool_call_seconds",
            "Tool calls by tool and outcome (ok or the error code), queue wait included.",
            ["tool", "outcome"],
            buckets=_TOOL_BUCKETS,
            registry=self.registry,
        )
        # Each (tool, outcome)'s child, and the tool.call event's: ``labels()`` checks and
        # joins its values under a lock at every call, a light call's share twice over.
        self._call_children: dict[tuple[str, str], Any] = {}
        self._call_event: Any = None
        pool = {
            "size": "Slots in the pool.",
            "busy": "Slots leased to a sandbox key.",
            "free": "Slots free to take.",
            "reserved": "Slots held for the head of the queue.",
            "queued": "Calls waiting for a slot.",
        }
        self._pool = {
            name: Gauge(f"sandbox_mcp_pool_{name}", text, registry=self.registry)
            for name, text in pool.items()
        }
        self._oldest_wait = Gauge(
            "sandbox_mcp_pool_oldest_wait_seconds",
            "How long the head of the queue has waited (0 when nobody waits).",
            registry=self.registry,
        )
        self._egress_refused = Counter(
            "sandbox_mcp_egress_refused",
            "Connections the egress proxy refused (network restricted), by reason.",
            ["reason"],
            registry=self.registry,
        )
        self._egress_bytes = Counter(
            "sandbox_mcp_egress_bytes",
            "Bytes moved through the egress proxy (network restricted), both ways.",
            registry=self.registry,
        )
        self._database_up = Gauge(
            "sandbox_mcp_database_up",
            "1 when the database answered the scrape.",
            registry=self.registry,
        )

    def count_event(
        self, _logger: object, method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        """A structlog processor: count the event, pass it on unchanged.

        A line with ``repeats_not_written`` (app/sampling.py, auth/log_sampling.py)
        stands for that many events not written: counted as them, so the counter holds
        every event, written or not (the count arrives as its minute ends)."""
        name = event.get("event")
        if isinstance(name, str) and name != TOOL_CALL_EVENT:
            repeats = event.get("repeats_not_written")
            counted = repeats if isinstance(repeats, int) and repeats > 0 else 1
            self._events.labels(name, method).inc(counted)
        return event

    def tool_call(self, tool: str, outcome: str, seconds: float) -> None:
        """A call ended (the runner's ``on_call``): its latency, and its ``tool.call``
        event, counted at the level the runner logs it whether or not it is written."""
        child = self._call_children.get((tool, outcome))
        if child is None:  # as many as tools times their outcomes, as prometheus keeps
            child = self._call_children[tool, outcome] = self._tool_calls.labels(tool, outcome)
        child.observe(seconds)
        if self._call_event is None:
            self._call_event = self._events.labels(TOOL_CALL_EVENT, "info")
        self._call_event.inc()

    def egress_refused(self, reason: str) -> None:
        self._egress_refused.labels(reason).inc()

    def egress_bytes(self, size: int) -> None:
        self._egress_bytes.inc(size)

    def set_pool(self, stats: PoolStats | None) -> None:
        self._database_up.set(0 if stats is None else 1)
        if stats is None:
            return
        for name, gauge in self._pool.items():
            gauge.set(getattr(stats, name))
        self._oldest_wait.set(stats.oldest_wait_s or 0.0)

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition in the format the scraper's Accept header asks for, and its type
        (the 0.0.4 text format when it asks for nothing in particular)."""
        encode, content_type = choose_encoder(accept or "")
        return encode(self.registry), content_type


@dataclass
class MetricsEndpoint:
    """``GET /metrics``; with ``token`` set, only for ``Authorization: Bearer <token>``."""

    metrics: Metrics
    pool_stats: Callable[[], Awaitable[PoolStats]]
    token: str | None

    async def handle(self, request: Request) -> Response:
        if self.token is not None:
            scheme, _, given = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), self.token.encode()
            ):
                return JSONResponse(
                    {
                        "error": "unauthorized",
                        "error_description": "Send the metrics token as a bearer token.",
                    },
                    status_code=401,
                    headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
                )
        try:
            stats: PoolStats | None = await self.pool_stats()
        except DatabaseUnavailable:
            stats = None  # still answer: the scrape itself reports the outage
        self.metrics.set_pool(stats)
        body, content_type = self.metrics.render(request.headers.get("accept"))
        return Response(body, headers={"Content-Type": content_type, "Cache-Control": "no-store"})
