"""The authorization server's persistence seam: clients, grants and hashed tokens.

A *grant* is one completed sign-in: it names the sandbox key and the client,
and every access and refresh token descends from it (the token "family").
Revoking a grant kills the whole family. The production implementation is
``app.storage.signin.auth_store.SqlAuthStore`` (``auth`` never imports ``app``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

TokenRole = Literal["access", "refresh"]
R = TypeVar("R")


@dataclass(frozen=True)
class Client:
    client_id: str
    client_name: str | None
    redirect_uris: tuple[str, ...]
    created_at: float
    last_grant_at: float | None = None


@dataclass(frozen=True)
class Grant:
    grant_id: str
    client_id: str
    sandbox_key: str
    resource: str
    scopes: tuple[str, ...]
    created_at: float
    revoked_at: float | None = None
    # The budget key of the browser that pressed the button (auth.client_address).
    signin_prefix: str | None = None


@dataclass(frozen=True)
class TokenRecord:
    """A token, known only by its keyed hash."""

    token_hash: str
    grant_id: str
    role: TokenRole
    expires_at: float
    rotated_at: float | None = None  # refresh tokens: when a successor replaced it


@dataclass(frozen=True)
class IssuedCode:
    """An authorization code as the database knows it: by the keyed hash of its id."""

    code_hash: str
    signin_prefix: str | None
    created_at: float
    expires_at: float


@dataclass(frozen=True)
class SigninCounts:
    """What the admission caps are decided on, read under the lock that serializes them."""

    prefix: str | None  # whose press it is
    prefix_recent: list[float]  # when each code from the prefix since ``burst_since`` was made
    # The hour's new sandboxes, from anyone: for each code made since ``hourly_since``
    # that was redeemed or may still be, (until when it counts, its prefix). A redeemed
    # code counts for the hour; one not redeemed only until it expires.
    hourly: list[tuple[float, str | None]]
    live_expiries: list[float]  # the prefix's live grants and unredeemed codes: when each ends


@dataclass(frozen=True)
class Redemption:
    """How a redemption went: ``first`` (its grant is stored), else a replay of a code whose
    first redemption created ``previous_grant`` (None: the code is unknown)."""

    first: bool
    previous_grant: str | None = None


class AuthStore(Protocol):
    async def save_client(self, client: Client) -> None:
        """Store a newly registered client."""
        ...

    async def upsert_client(self, client: Client) -> None:
        """Store a client described by a metadata document, or update its name and
        redirect URIs; its creation time and last grant are kept."""
        ...

    async def load_client(self, client_id: str) -> Client | None:
        """The client, or None if it never registered or was removed."""
        ...

    async def delete_stale_clients(self, created_before: float) -> int:
        """Remove clients created before then that never completed a grant; returns how many."""
        ...

    async def create_grant(self, grant: Grant, tokens: list[TokenRecord]) -> None:
        """Store a new grant with its first tokens, and mark its client as used (atomic)."""
        ...

    async def issue_code(
        self,
        code: IssuedCode,
        *,
        burst_since: float,
        hourly_since: float,
        refuse: Callable[[SigninCounts], R | None],
    ) -> IssuedCode | R:
        """Record a code about to be handed out, if ``refuse`` lets it, in one step that
        every process serializes (two presses cannot both take the last place).

        Returns the code as recorded: ``code`` itself, or the earlier record with the same
        hash (a double press: nothing new is counted); else what ``refuse`` returned.
        """
        ...

    async def signin_counts(
        self, signin_prefix: str, now: float, *, burst_since: float, hourly_since: float
    ) -> SigninCounts:
        """What ``issue_code`` would decide on now, read without deciding anything."""
        ...

    async def redeem_code(
        self, code_hash: str, grant: Grant, tokens: list[TokenRecord]
    ) -> Redemption:
        """Mark the code redeemed and store its grant and first tokens, atomically; a code
        already redeemed (on any process) stores nothing and names its first grant."""
        ...

    async def live_grant_expiries(self, signin_prefix: str, now: float) -> list[float]:
        """For each unrevoked grant signed in from ``signin_prefix`` that still has an
        unexpired refresh token: when its last refresh token expires."""
        ...

    async def load_token(self, token_hash: str) -> tuple[TokenRecord, Grant] | None:
        """The token and its grant, or None for an unknown hash."""
        ...

    async def rotate(self, old_hash: str, rotated_at: float, new_tokens: list[TokenRecord]) -> bool:
        """Mark a refresh token rotated and store its successors, atomically.

        Returns False (and stores nothing) if the token was already rotated:
        two concurrent refreshes must not fork the family.
        """
        ...

    async def revoke_grant(self, grant_id: str, revoked_at: float) -> None:
        """Revoke a grant: every token of its family stops working, and every process
        that cached one hears of it (``TokenService.forget``)."""
        ...

    async def delete_token(self, token_hash: str) -> None:
        """Forget one token (RFC 7009 revocation of an access token), telling every
        process as ``revoke_grant`` does."""
        ...

    async def delete_expired(self, now: float) -> int:
        """Remove expired tokens (and revoked grants with no tokens left); returns how many."""
        ...
