"""How many tool calls each sandbox has in flight, bounded per sandbox and per sign-in
address.

Each call in flight holds an HTTP connection (or, served as an MCP task, a
background call), and the connection guard caps connections server-wide: without
a per-sandbox bound, one tenant whose calls legitimately wait (``get_job_result``
with a long ``wait_s``, a synchronous command) could hold every connection the
server accepts, after which everyone else's is closed unanswered. A call past
the bound is refused at once, so its connection is free again straight away.

The sandboxes signed in from one address (hosted mode; up to 20 by default) share a
second bound, so filling the server's connections takes many addresses, not one
address's sandboxes.
"""

from __future__ import annotations

from collections import Counter

from app.errors import TooManyCalls

DEFAULT_PER_SANDBOX = 32
DEFAULT_PER_ADDRESS = 128  # four sandboxes' worth: 32 addresses to fill 4,096 connections


class CallsInFlight:
    """Counts each sandbox key's (and sign-in address's) calls between :meth:`enter`
    and :meth:`leave`."""

    def __init__(
        self, per_sandbox: int = DEFAULT_PER_SANDBOX, per_address: int = DEFAULT_PER_ADDRESS
    ) -> None:
        self.per_sandbox = per_sandbox
        self.per_address = per_address
        self._open: Counter[str] = Counter()
        self._by_address: Counter[str] = Counter()

    def __len__(self) -> int:
        """Calls in flight, all sandboxes together."""
        return sum(self._open.values())

    def of(self, sandbox_key: str) -> int:
        return self._open[sandbox_key]

    def enter(self, sandbox_key: str, address: str | None = None) -> None:
        """Count one more call of ``sandbox_key`` signed in from ``address`` (None:
        local mode); every successful enter needs a leave with the same arguments.

        Raises:
            TooManyCalls: the sandbox already has ``per_sandbox`` calls in flight, or
                its address ``per_address``.
        """
        # No line of its own here: the call's ``tool.call`` line (sampled per sandbox,
        # app/mcp/call_sampling.py) says TOO_MANY_CALLS; one per refusal was unbounded.
        if self._open[sandbox_key] >= self.per_sandbox:
            raise TooManyCalls(self.per_sandbox)
        if address is not None and self._by_address[address] >= self.per_address:
            raise TooManyCalls(self.per_address, per="address")
        self._open[sandbox_key] += 1
        if address is not None:
            self._by_address[address] += 1

    def leave(self, sandbox_key: str, address: str | None = None) -> None:
        _drop(self._open, sandbox_key)
        if address is not None:
            _drop(self._by_address, address)


def _drop(counts: Counter[str], key: str) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]
