"""How many tool calls each sandbox has in flight, bounded per sandbox.

Each call in flight holds an HTTP connection (or, served as an MCP task, a
background call), and the connection guard caps connections server-wide: without
a per-sandbox bound, one tenant whose calls legitimately wait (``get_job_result``
with a long ``wait_s``, a synchronous command) could hold every connection the
server accepts, after which everyone else's is closed unanswered. A call past
the bound is refused at once, so its connection is free again straight away.
"""

from __future__ import annotations

from collections import Counter

import structlog

from app.errors import TooManyCalls

log = structlog.get_logger(__name__)

DEFAULT_PER_SANDBOX = 32


class CallsInFlight:
    """Counts each sandbox key's calls between :meth:`enter` and :meth:`leave`."""

    def __init__(self, per_sandbox: int = DEFAULT_PER_SANDBOX) -> None:
        self.per_sandbox = per_sandbox
        self._open: Counter[str] = Counter()

    def __len__(self) -> int:
        """Calls in flight, all sandboxes together."""
        return sum(self._open.values())

    def of(self, sandbox_key: str) -> int:
        return self._open[sandbox_key]

    def enter(self, sandbox_key: str) -> None:
        """Count one more call of ``sandbox_key``; every successful enter needs a leave.

        Raises:
            TooManyCalls: the sandbox already has ``per_sandbox`` calls in flight.
        """
        if self._open[sandbox_key] >= self.per_sandbox:
            log.info("mcp.call_refused", limit="calls_per_sandbox", value=self.per_sandbox)
            raise TooManyCalls(self.per_sandbox)
        self._open[sandbox_key] += 1

    def leave(self, sandbox_key: str) -> None:
        self._open[sandbox_key] -= 1
        if self._open[sandbox_key] <= 0:
            del self._open[sandbox_key]
