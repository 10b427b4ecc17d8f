"""The sign-in's admissions (``SqlAuthStore.issue_code``), decided in batches.

Every process serializes the decision whether a press of "Create my sandbox" may hand
out a code (an asyncio lock, and on PostgreSQL an advisory lock across processes), and
it used to take a transaction a press: under the fairness bench's flood of presses an
honest one waited for each of the flood's transactions ahead of it, about 0.45 s each
on a database busy with the tenants' work (issue 25: ``POST /authorize`` median 11.9 s
under attack). The presses that queue while a transaction runs are now decided
together (``app.storage.batches``, at most ``MAX_ADMISSIONS`` a transaction): one read
of the codes and live grants they concern, then each press in order against those rows
and the codes admitted before it in the batch, as if it came alone (``CodeBook``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from auth.store import IssuedCode, SigninCounts

# The most presses one transaction decides: its reads name two values a press (the
# code's hash, its prefix), well under any database's limit of bound parameters.
MAX_ADMISSIONS = 100


@dataclass(frozen=True, eq=False)
class Press:
    """One press waiting for its admission: ``refuse`` says why not, from the counts."""

    code: IssuedCode
    burst_since: float
    hourly_since: float
    refuse: Callable[[SigninCounts], object | None]


@dataclass(frozen=True)
class StoredCode:
    """A code's row as the counts need it."""

    code_hash: str
    signin_prefix: str | None
    created_at: float
    expires_at: float
    grant_id: str | None


@dataclass(frozen=True)
class Ask:
    """What one decision counts on: the prefix's codes and grants at ``now``."""

    code_hash: str | None
    prefix: str | None
    now: float
    burst_since: float
    hourly_since: float


class CodeBook:
    """The codes and live grants a batch of asks concerns, read in one go (a superset:
    each count filters its own); each ask is then counted from them as if alone."""

    def __init__(
        self, codes: Iterable[StoredCode], grants: Iterable[tuple[str | None, float]]
    ) -> None:
        self._codes = list(codes)
        self._by_hash = {code.code_hash: code for code in self._codes}
        self._grants = list(grants)  # (prefix, when its last refresh token expires)

    def earlier(self, code_hash: str) -> IssuedCode | None:
        """The code recorded before with this hash (a double press), or None."""
        code = self._by_hash.get(code_hash)
        if code is None:
            return None
        return IssuedCode(code.code_hash, code.signin_prefix, code.created_at, code.expires_at)

    def add(self, code: IssuedCode) -> None:
        """Count ``code`` for the asks after it."""
        added = StoredCode(
            code.code_hash, code.signin_prefix, code.created_at, code.expires_at, None
        )
        self._codes.append(added)
        self._by_hash[code.code_hash] = added

    def counts(self, ask: Ask) -> SigninCounts:
        # Redeemed codes are the hour's new sandboxes; a code not yet redeemed holds a
        # place while it may be (else codes handed out could overrun the cap), and one
        # that expired unredeemed frees it.
        now = ask.now
        hour_s = now - ask.hourly_since
        hourly = [
            (
                code.created_at + hour_s
                if code.grant_id is not None
                else min(code.created_at + hour_s, code.expires_at),
                code.signin_prefix,
            )
            for code in self._codes
            if code.created_at > ask.hourly_since
            and (code.grant_id is not None or code.expires_at > now)
        ]
        prefix = ask.prefix
        if prefix is None:
            return SigninCounts(None, [], hourly, [])
        mine = [
            code
            for code in self._codes
            if code.signin_prefix == prefix
            and (code.created_at > ask.burst_since or code.expires_at > now)
        ]
        live = [expiry for signin, expiry in self._grants if signin == prefix and expiry > now]
        live += [
            code.expires_at for code in mine if code.grant_id is None and code.expires_at > now
        ]
        recent = sorted(code.created_at for code in mine if code.created_at > ask.burst_since)
        return SigninCounts(prefix, recent, hourly, live)


def ask_of(press: Press) -> Ask:
    code = press.code
    return Ask(
        code.code_hash, code.signin_prefix, code.created_at, press.burst_since, press.hourly_since
    )
