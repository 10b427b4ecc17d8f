"""Whether a pressed, CSRF-checked sign-in may create one more sandbox.

Three limits, checked together and charged only when all agree (a refused
press spends nothing), and only for presses that passed the CSRF and
transaction check (a junk POST spends nobody's budget):

- sandboxes per address prefix per minute (the burst);
- live sandboxes per address prefix: grants from that prefix that are not
  revoked and still hold an unexpired refresh token, plus the codes handed out
  but not yet redeemed, which have no grant yet;
- new sandboxes per hour, server-wide (the pool is filled by many prefixes),
  of which one network (IPv4 /24, IPv6 /48) and one address prefix may take
  only their share (``auth.ratelimit.Shares``), so that a few networks cannot
  spend the hour and turn every new user away.

The hour counts codes redeemed (the sandboxes created) and codes that may still
be redeemed: a code holds its place until it expires (``code_ttl_s``), since
otherwise codes handed out and redeemed later could overrun the cap; a code
that expired unredeemed created nothing and frees its place.

All three are read from the database (the codes handed out are recorded there
by hash) in one step every process serializes, so a restart forgets nothing
and several processes do not multiply any limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from auth.client_address import network_key
from auth.config import AuthConfig
from auth.store import AuthStore, IssuedCode, SigninCounts

BURST_WINDOW_S = 60
HOURLY_WINDOW_S = 3600


@dataclass(frozen=True)
class Refusal:
    """Shown on the sign-in page with HTTP 429 and ``Retry-After``."""

    limit: str  # which one bit, for the log: burst, hourly_address, hourly_network, hourly, live
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


@dataclass(frozen=True)
class Admitted:
    """The code as recorded; ``first`` is false for a double press (nothing new counted)."""

    issued: IssuedCode
    first: bool


def _retry_after(events: list[float], limit: int, window_s: float, now: float) -> int:
    """0 if one more event is within ``limit`` per ``window_s``, else seconds until it is."""
    if len(events) < limit:
        return 0
    return max(1, int(events[-limit] + window_s - now) + 1)


def _until_under(untils: list[float], limit: int, now: float) -> int:
    """0 if fewer than ``limit`` places are held, else the seconds until enough of them
    (each held until its time in ``untils``) free one."""
    if len(untils) < limit:
        return 0
    return max(1, int(sorted(untils)[len(untils) - limit] - now) + 1)


class SigninAdmission:
    def __init__(
        self,
        config: AuthConfig,
        store: AuthStore,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._clock = clock
        self._live_cap = config.sandboxes_per_address
        self._burst = config.signins_per_address_per_minute
        self._hourly = config.new_sandboxes_per_hour
        self._hourly_per_prefix, self._hourly_per_network = config.shares.of(self._hourly)

    async def admit(self, code: IssuedCode) -> Admitted | Refusal:
        """Record ``code`` if every limit agrees (or it was recorded before), else why not."""
        outcome = await self._store.issue_code(
            code,
            burst_since=code.created_at - BURST_WINDOW_S,
            hourly_since=code.created_at - HOURLY_WINDOW_S,
            refuse=lambda counts: self._refusal(counts, code.created_at),
        )
        if isinstance(outcome, Refusal):
            return outcome
        return Admitted(outcome, first=outcome == code)

    async def check(self, prefix: str) -> Refusal | None:
        """Why ``prefix`` may not create a sandbox now, or None. Spends nothing."""
        now = self._clock()
        counts = await self._store.signin_counts(
            prefix, now, burst_since=now - BURST_WINDOW_S, hourly_since=now - HOURLY_WINDOW_S
        )
        return self._refusal(counts, now)

    def _hourly_refusal(self, counts: SigninCounts, now: float) -> Refusal | None:
        prefix = counts.prefix
        network = network_key(prefix) if prefix is not None else None
        held = counts.hourly
        limits = [
            (
                "hourly_address",
                [until for until, signin in held if prefix and signin == prefix],
                self._hourly_per_prefix,
                "Too many new sandboxes from your address",
                f"One network address may create at most {self._hourly_per_prefix} of this "
                f"server's {self._hourly} new sandboxes an hour, and yours",
            ),
            (
                "hourly_network",
                [u for u, signin in held if network and signin and network_key(signin) == network],
                self._hourly_per_network,
                "Too many new sandboxes from your network",
                f"One network ({network}) may create at most {self._hourly_per_network} of "
                f"this server's {self._hourly} new sandboxes an hour, and yours",
            ),
            (
                "hourly",
                [until for until, _ in held],
                self._hourly,
                "The server is full for now",
                f"This server creates at most {self._hourly} new sandboxes an hour, and "
                "everyone together",
            ),
        ]
        for limit, untils, cap, title, who in limits:
            wait = _until_under(untils, cap, now)
            if wait:
                message = f"{who} created that many in the last hour. Try again in {_wait(wait)}."
                return Refusal(limit, title, message, wait)
        return None

    def _refusal(self, counts: SigninCounts, now: float) -> Refusal | None:
        wait = _retry_after(counts.prefix_recent, self._burst, BURST_WINDOW_S, now)
        if wait:
            return Refusal(
                "burst",
                "Slow down",
                "Too many sandboxes were created from your network address in the last "
                f"minute. Try again in {_wait(wait)}.",
                wait,
            )
        hourly = self._hourly_refusal(counts, now)
        if hourly is not None:
            return hourly
        expiries = counts.live_expiries
        # The place frees when enough of them expire to bring the count under the cap.
        wait = _until_under(expiries, self._live_cap, now)
        if not wait:
            return None
        frees_at = now + wait
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
