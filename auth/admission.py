"""Whether a pressed, CSRF-checked sign-in may create one more sandbox.

Three limits, checked together and charged only when all agree (a refused
press spends nothing), and only for presses that passed the CSRF and
transaction check (a junk POST spends nobody's budget):

- sandboxes per address prefix per minute (the burst);
- live sandboxes per address prefix: grants from that prefix that are not
  revoked and still hold an unexpired refresh token, read from the auth store
  (so a restart forgets nothing), plus the codes handed out but not yet
  redeemed, which have no grant yet;
- new sandboxes per hour, server-wide (the pool is filled by many prefixes,
  and an IPv6 attacker has many /64s).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from auth.config import AuthConfig
from auth.pending import CodeGrant
from auth.ratelimit import RateLimiter
from auth.store import AuthStore


@dataclass(frozen=True)
class Refusal:
    """Shown on the sign-in page with HTTP 429 and ``Retry-After``."""

    limit: str  # which one bit, for the log: burst, hourly or live
    title: str
    message: str
    retry_after_s: int


def _wait(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} seconds"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} minutes"
    if seconds < 36 * 3600:
        return f"{round(seconds / 3600)} hours"
    return f"{round(seconds / 86400)} days"


class SigninAdmission:
    def __init__(
        self,
        config: AuthConfig,
        store: AuthStore,
        *,
        clock: Callable[[], float] = time.time,
        max_prefixes: int = 10_000,
    ) -> None:
        self._store = store
        self._clock = clock
        self._live_cap = config.sandboxes_per_address
        self._burst = RateLimiter(config.signins_per_address_per_minute, 60, clock=clock)
        self._hourly = RateLimiter(config.new_sandboxes_per_hour, 3600, clock=clock)
        # Codes handed out per prefix, until redeemed or expired (then the store counts them).
        self._codes: OrderedDict[str, deque[CodeGrant]] = OrderedDict()
        self._max_prefixes = max_prefixes
        # Check, create and charge happen under one lock: two presses racing past the
        # store query must not both take the last place.
        self.lock = asyncio.Lock()

    def _unredeemed(self, prefix: str, now: float) -> list[CodeGrant]:
        codes = self._codes.get(prefix)
        if codes is None:
            return []
        while codes and (codes[0].expires_at <= now or codes[0].redeeming):
            codes.popleft()
        return [c for c in codes if not c.redeeming and c.expires_at > now]

    async def check(self, prefix: str) -> Refusal | None:
        """Why ``prefix`` may not create a sandbox now, or None. Spends nothing."""
        wait = self._burst.retry_after_s(prefix)
        if wait:
            return Refusal(
                "burst",
                "Slow down",
                "Too many sandboxes were created from your network address in the last "
                f"minute. Try again in {_wait(wait)}.",
                wait,
            )
        wait = self._hourly.retry_after_s()
        if wait:
            return Refusal(
                "hourly",
                "The server is full for now",
                f"This server creates at most {self._hourly.limit} new sandboxes an hour, "
                f"and that many were created in the last hour. Try again in {_wait(wait)}.",
                wait,
            )
        now = self._clock()
        expiries = await self._store.live_grant_expiries(prefix, now)
        expiries += [code.expires_at for code in self._unredeemed(prefix, now)]
        if len(expiries) < self._live_cap:
            return None
        expiries.sort()
        # The place frees when enough of them expire to bring the count under the cap.
        frees_at = expiries[len(expiries) - self._live_cap]
        wait = max(1, int(frees_at - now) + 1)
        when = datetime.fromtimestamp(frees_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
        return Refusal(
            "live",
            "Too many sandboxes from your network",
            f"Your network address already has {len(expiries)} signed-in sandboxes, the most "
            f"this server allows for one address ({self._live_cap}). Try again after {when} "
            f"(in {_wait(wait)}), when the oldest sign-in expires, or sooner once one of "
            "them is signed out.",
            wait,
        )

    def charge(self, prefix: str, code: CodeGrant) -> None:
        """Count the sandbox ``code`` stands for against ``prefix``."""
        self._burst.charge(prefix)
        self._hourly.charge()
        codes = self._codes.get(prefix)
        if codes is None:
            if len(self._codes) >= self._max_prefixes:
                self._codes.popitem(last=False)
            codes = self._codes[prefix] = deque()
        else:
            self._codes.move_to_end(prefix)
        codes.append(code)
