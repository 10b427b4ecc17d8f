"""``subscriptions/listen`` streams, bounded per sandbox and server-wide.

On the 2026-07-28 wire a client opts in to server events by sending a
``subscriptions/listen`` POST whose response *is* the stream, and Claude Code
holds one open for as long as it runs. Each stream is a connection, a task and
a buffer; the SDK bounds them only server-wide (and answers ``INTERNAL_ERROR``
past it), so one sign-in opening streams in a loop would hold every one of
them. Here each sandbox key gets its own share, the refusal says which cap bit,
and :meth:`CappedListenHandler.close` ends every open stream gracefully when
the server shuts down: uvicorn waits for open responses before it runs the
lifespan's shutdown, so without it one listening client keeps a stopping
server alive for as long as it stays connected.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import structlog
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import ListenHandler, SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_REQUEST, SubscriptionsListenRequestParams, SubscriptionsListenResult

from app.mcp.runner import Identity

log = structlog.get_logger(__name__)

# The stable code clients (and tests) can match on, in the JSON-RPC error's data.
TOO_MANY_STREAMS = "TOO_MANY_LISTEN_STREAMS"


class CappedListenHandler(ListenHandler):
    """The SDK's listen handler with a per-sandbox cap in front of its global one."""

    def __init__(
        self, bus: SubscriptionBus, identity: Identity, *, per_sandbox: int, total: int
    ) -> None:
        super().__init__(bus, max_subscriptions=total)
        self._identity = identity
        self._per_sandbox = per_sandbox
        self._total = total
        self._open: Counter[str] = Counter()
        self._closing = False

    @property
    def open_streams(self) -> int:
        return sum(self._open.values())

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        key = self._identity.sandbox_key() or ""
        self._refuse_if_full(key)
        self._open[key] += 1
        try:
            return await super().__call__(ctx, params)
        finally:
            self._open[key] -= 1
            if self._open[key] <= 0:
                del self._open[key]

    def _refuse_if_full(self, key: str) -> None:
        if self._closing:
            raise MCPError(
                INVALID_REQUEST,
                "The server is shutting down; listen again once it is back.",
                {"code": "SHUTTING_DOWN"},
            )
        if self._open[key] >= self._per_sandbox:
            log.info("mcp.listen_refused", limit="per_sandbox", value=self._per_sandbox)
            raise MCPError(
                INVALID_REQUEST,
                f"This sandbox already has {self._per_sandbox} subscriptions/listen streams "
                "open, the most one sandbox may hold; close one (end an idle client) and "
                "listen again.",
                {"code": TOO_MANY_STREAMS, "limit": "per_sandbox", "value": self._per_sandbox},
            )
        if self.open_streams >= self._total:
            log.warning("mcp.listen_refused", limit="server", value=self._total)
            raise MCPError(
                INVALID_REQUEST,
                f"The server holds {self._total} subscriptions/listen streams, its most; "
                "listen again in a few minutes (tool calls work without a stream).",
                {"code": TOO_MANY_STREAMS, "limit": "server", "value": self._total},
            )

    def close(self) -> None:
        """End every open stream with its final result frame and refuse new ones."""
        self._closing = True
        if self._open:
            log.info("mcp.listen_streams_closed", count=self.open_streams)
        super().close()
