"""``auth.store.AuthStore`` on the service's database (SQLAlchemy)."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.batches import Batches
from app.storage.db import Base, transaction, upsert_insert
from app.storage.signin.auth_admissions import (
    MAX_ADMISSIONS,
    Ask,
    CodeBook,
    Press,
    StoredCode,
    ask_of,
)
from auth.store import (
    Client,
    Grant,
    IssuedCode,
    Redemption,
    SigninCounts,
    TokenRecord,
    TokenRole,
)

R = TypeVar("R")
# pg_advisory_xact_lock key serializing the admission decisions of every process.
_ADMISSION_LOCK = 0x736D_6370_6164_6D31  # "smcpadm1"
# Where a revocation is announced on PostgreSQL (app.storage.slots.ready_relay.PgChannel), in the
# transaction that makes it, so every process hears of it once it holds:
# "grant:<grant id>" or "token:<token hash>".
REVOKED_CHANNEL = "sandbox_mcp_revoked"


def parse_revocation(payload: str) -> tuple[str | None, str | None]:
    """The (grant id, token hash) a revocation notice names; one of them is None."""
    kind, _, name = payload.partition(":")
    return (name, None) if kind == "grant" else (None, name)


async def _announce_revoked(session: AsyncSession, payload: str) -> None:
    if session.get_bind().dialect.name == "postgresql":
        # Delivered at commit, to every listening process (and only if it commits).
        await session.execute(
            sa.text("SELECT pg_notify(:channel, :payload)"),
            {"channel": REVOKED_CHANNEL, "payload": payload},
        )


class OAuthClientRow(Base):
    __tablename__ = "oauth_clients"

    client_id: Mapped[str] = mapped_column(sa.String(512), primary_key=True)
    client_name: Mapped[str | None] = mapped_column(sa.String(100))
    redirect_uris: Mapped[str] = mapped_column(sa.Text)  # JSON list
    created_at: Mapped[float] = mapped_column(sa.Float)
    last_grant_at: Mapped[float | None] = mapped_column(sa.Float)


class OAuthGrantRow(Base):
    """One completed sign-in: its client and its sandbox key; tokens descend from it."""

    __tablename__ = "oauth_grants"

    grant_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    client_id: Mapped[str] = mapped_column(
        sa.String(512), sa.ForeignKey("oauth_clients.client_id", ondelete="CASCADE")
    )
    sandbox_key: Mapped[str] = mapped_column(sa.String(128), index=True)
    resource: Mapped[str] = mapped_column(sa.String(2000))
    scopes: Mapped[str] = mapped_column(sa.String(200))  # space-separated
    created_at: Mapped[float] = mapped_column(sa.Float)
    revoked_at: Mapped[float | None] = mapped_column(sa.Float)
    signin_prefix: Mapped[str | None] = mapped_column(sa.String(64), index=True)


class OAuthTokenRow(Base):
    """A token known only by its HMAC; its value is never stored."""

    __tablename__ = "oauth_tokens"

    token_hash: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    grant_id: Mapped[str] = mapped_column(
        sa.String(64), sa.ForeignKey("oauth_grants.grant_id", ondelete="CASCADE"), index=True
    )
    role: Mapped[str] = mapped_column(sa.String(16))
    expires_at: Mapped[float] = mapped_column(sa.Float)
    rotated_at: Mapped[float | None] = mapped_column(sa.Float)


class OAuthCodeRow(Base):
    """A code handed out, by the keyed hash of its id; the code itself is never stored."""

    __tablename__ = "oauth_codes"

    code_hash: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    signin_prefix: Mapped[str | None] = mapped_column(sa.String(64), index=True)
    created_at: Mapped[float] = mapped_column(sa.Float, index=True)
    expires_at: Mapped[float] = mapped_column(sa.Float)
    grant_id: Mapped[str | None] = mapped_column(sa.String(64))


class SqlAuthStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        # One batch of admissions at a time in this process (SQLite serves one process);
        # PostgreSQL takes a transaction-level advisory lock as well, for the others.
        self._admissions: Batches[Press, object] = Batches(
            self._admit_all, max_batch=MAX_ADMISSIONS
        )

    def _transaction(self) -> AbstractAsyncContextManager[AsyncSession]:
        return transaction(self._sessions)

    async def save_client(self, client: Client) -> None:
        async with self._transaction() as session:
            session.add(self._client_row(client))

    @staticmethod
    def _client_row(client: Client) -> OAuthClientRow:
        return OAuthClientRow(
            client_id=client.client_id,
            client_name=client.client_name,
            redirect_uris=json.dumps(list(client.redirect_uris)),
            created_at=client.created_at,
            last_grant_at=client.last_grant_at,
        )

    async def upsert_client(self, client: Client) -> None:
        # One atomic INSERT ... ON CONFLICT DO UPDATE: two first sign-ins of a new
        # document client cannot race (both dialects we run on have it).
        async with self._transaction() as session:
            dialect = session.get_bind().dialect.name
            statement = upsert_insert(dialect)(OAuthClientRow).values(
                client_id=client.client_id,
                client_name=client.client_name,
                redirect_uris=json.dumps(list(client.redirect_uris)),
                created_at=client.created_at,
                last_grant_at=client.last_grant_at,
            )
            await session.execute(
                statement.on_conflict_do_update(
                    index_elements=[OAuthClientRow.client_id],
                    set_={
                        "client_name": statement.excluded.client_name,
                        "redirect_uris": statement.excluded.redirect_uris,
                    },
                )
            )

    async def load_client(self, client_id: str) -> Client | None:
        async with self._transaction() as session:
            row = await session.get(OAuthClientRow, client_id)
            if row is None:
                return None
            return Client(
                row.client_id,
                row.client_name,
                tuple(json.loads(row.redirect_uris)),
                row.created_at,
                row.last_grant_at,
            )

    async def delete_stale_clients(self, created_before: float) -> int:
        async with self._transaction() as session:
            result = await session.execute(
                sa.delete(OAuthClientRow).where(
                    OAuthClientRow.created_at < created_before,
                    OAuthClientRow.last_grant_at.is_(None),
                )
            )
            return int(getattr(result, "rowcount", 0) or 0)

    async def create_grant(self, grant: Grant, tokens: list[TokenRecord]) -> None:
        async with self._transaction() as session:
            await self._add_grant(session, grant, tokens)

    @staticmethod
    async def _add_grant(session: AsyncSession, grant: Grant, tokens: list[TokenRecord]) -> None:
        session.add(
            OAuthGrantRow(
                grant_id=grant.grant_id,
                client_id=grant.client_id,
                sandbox_key=grant.sandbox_key,
                resource=grant.resource,
                scopes=" ".join(grant.scopes),
                created_at=grant.created_at,
                revoked_at=None,
                signin_prefix=grant.signin_prefix,
            )
        )
        await session.flush()
        session.add_all(_token_row(t) for t in tokens)
        await session.execute(
            sa.update(OAuthClientRow)
            .where(OAuthClientRow.client_id == grant.client_id)
            .values(last_grant_at=grant.created_at)
        )

    async def issue_code(
        self,
        code: IssuedCode,
        *,
        burst_since: float,
        hourly_since: float,
        refuse: Callable[[SigninCounts], R | None],
    ) -> IssuedCode | R:
        # The presses queued behind a transaction are decided together by the next
        # (app/storage/signin/auth_admissions.py): a flood's presses cost an honest one a
        # transaction or two, not one each.
        outcome = await self._admissions.decide(Press(code, burst_since, hourly_since, refuse))
        return cast("IssuedCode | R", outcome)

    async def _admit_all(self, presses: list[Press]) -> list[object]:
        """Each press's outcome in order, in one transaction that holds the admission
        lock: the earlier record of its code, what ``refuse`` returned, or its code, then
        recorded and counted for the presses after it."""
        async with self._transaction() as session:
            if session.get_bind().dialect.name == "postgresql":
                await session.execute(
                    sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ADMISSION_LOCK}
                )
            book = await self._code_book(session, [ask_of(press) for press in presses])
            outcomes: list[object] = []
            for press in presses:
                code = press.code
                earlier = book.earlier(code.code_hash)
                if earlier is not None:
                    outcomes.append(earlier)
                    continue
                refused = press.refuse(book.counts(ask_of(press)))
                if refused is not None:
                    outcomes.append(refused)
                    continue
                book.add(code)
                session.add(
                    OAuthCodeRow(
                        code_hash=code.code_hash,
                        signin_prefix=code.signin_prefix,
                        created_at=code.created_at,
                        expires_at=code.expires_at,
                        grant_id=None,
                    )
                )
                outcomes.append(code)
            return outcomes

    async def signin_counts(
        self, signin_prefix: str, now: float, *, burst_since: float, hourly_since: float
    ) -> SigninCounts:
        ask = Ask(None, signin_prefix, now, burst_since, hourly_since)
        async with self._transaction() as session:
            return (await self._code_book(session, [ask])).counts(ask)

    @staticmethod
    async def _code_book(session: AsyncSession, asks: list[Ask]) -> CodeBook:
        """Every code and live grant any of ``asks`` counts, in two reads (a superset:
        each ask's count filters its own)."""
        hashes = {ask.code_hash for ask in asks if ask.code_hash is not None}
        prefixes = {ask.prefix for ask in asks if ask.prefix is not None}
        earliest = min(min(ask.hourly_since, ask.burst_since) for ask in asks)
        first_now = min(ask.now for ask in asks)
        wanted = [OAuthCodeRow.created_at > earliest]
        if prefixes:
            wanted.append(
                OAuthCodeRow.signin_prefix.in_(prefixes) & (OAuthCodeRow.expires_at > first_now)
            )
        if hashes:
            wanted.append(OAuthCodeRow.code_hash.in_(hashes))
        rows = await session.execute(
            sa.select(
                OAuthCodeRow.code_hash,
                OAuthCodeRow.signin_prefix,
                OAuthCodeRow.created_at,
                OAuthCodeRow.expires_at,
                OAuthCodeRow.grant_id,
            ).where(sa.or_(*wanted))
        )
        codes = [StoredCode(*row) for row in rows]
        if not prefixes:
            return CodeBook(codes, [])
        # Per grant: when its last refresh token expires (its prefix beside it).
        grants = await session.execute(
            sa.select(OAuthGrantRow.signin_prefix, sa.func.max(OAuthTokenRow.expires_at))
            .join(OAuthGrantRow, OAuthGrantRow.grant_id == OAuthTokenRow.grant_id)
            .where(
                OAuthGrantRow.signin_prefix.in_(prefixes),
                OAuthGrantRow.revoked_at.is_(None),
                OAuthTokenRow.role == "refresh",
                OAuthTokenRow.expires_at > first_now,
            )
            .group_by(OAuthGrantRow.grant_id, OAuthGrantRow.signin_prefix)
        )
        return CodeBook(codes, [(signin, float(expiry)) for signin, expiry in grants.all()])

    async def redeem_code(
        self, code_hash: str, grant: Grant, tokens: list[TokenRecord]
    ) -> Redemption:
        async with self._transaction() as session:
            # Compare-and-set: on PostgreSQL a concurrent redemption waits for this row,
            # then finds it taken; the loser learns which grant to revoke.
            result = await session.execute(
                sa.update(OAuthCodeRow)
                .where(OAuthCodeRow.code_hash == code_hash, OAuthCodeRow.grant_id.is_(None))
                .values(grant_id=grant.grant_id)
            )
            if not getattr(result, "rowcount", 0):
                row = await session.get(OAuthCodeRow, code_hash)
                return Redemption(False, None if row is None else row.grant_id)
            await self._add_grant(session, grant, tokens)
            return Redemption(True)

    async def live_grant_expiries(self, signin_prefix: str, now: float) -> list[float]:
        async with self._transaction() as session:
            return await self._live_grant_expiries(session, signin_prefix, now)

    @staticmethod
    async def _live_grant_expiries(
        session: AsyncSession, signin_prefix: str, now: float
    ) -> list[float]:
        result = await session.execute(
            sa.select(sa.func.max(OAuthTokenRow.expires_at))
            .join(OAuthGrantRow, OAuthGrantRow.grant_id == OAuthTokenRow.grant_id)
            .where(
                OAuthGrantRow.signin_prefix == signin_prefix,
                OAuthGrantRow.revoked_at.is_(None),
                OAuthTokenRow.role == "refresh",
                OAuthTokenRow.expires_at > now,
            )
            .group_by(OAuthGrantRow.grant_id)
        )
        return [float(expiry) for expiry in result.scalars()]

    async def load_token(self, token_hash: str) -> tuple[TokenRecord, Grant] | None:
        async with self._transaction() as session:
            found = (
                await session.execute(
                    sa.select(OAuthTokenRow, OAuthGrantRow)
                    .join(OAuthGrantRow, OAuthGrantRow.grant_id == OAuthTokenRow.grant_id)
                    .where(OAuthTokenRow.token_hash == token_hash)
                )
            ).first()
            if found is None:
                return None
            token, grant = found
            return (
                TokenRecord(
                    token.token_hash,
                    token.grant_id,
                    cast(TokenRole, token.role),
                    token.expires_at,
                    token.rotated_at,
                ),
                Grant(
                    grant.grant_id,
                    grant.client_id,
                    grant.sandbox_key,
                    grant.resource,
                    tuple(grant.scopes.split()),
                    grant.created_at,
                    grant.revoked_at,
                    grant.signin_prefix,
                ),
            )

    async def rotate(self, old_hash: str, rotated_at: float, new_tokens: list[TokenRecord]) -> bool:
        async with self._transaction() as session:
            # Compare-and-set: only the first of two concurrent refreshes wins.
            result = await session.execute(
                sa.update(OAuthTokenRow)
                .where(OAuthTokenRow.token_hash == old_hash, OAuthTokenRow.rotated_at.is_(None))
                .values(rotated_at=rotated_at)
            )
            if not getattr(result, "rowcount", 0):
                return False
            session.add_all(_token_row(t) for t in new_tokens)
            return True

    async def revoke_grant(self, grant_id: str, revoked_at: float) -> None:
        async with self._transaction() as session:
            await session.execute(
                sa.update(OAuthGrantRow)
                .where(OAuthGrantRow.grant_id == grant_id)
                .values(revoked_at=revoked_at)
            )
            await session.execute(
                sa.delete(OAuthTokenRow).where(OAuthTokenRow.grant_id == grant_id)
            )
            await _announce_revoked(session, f"grant:{grant_id}")

    async def delete_token(self, token_hash: str) -> None:
        async with self._transaction() as session:
            await session.execute(
                sa.delete(OAuthTokenRow).where(OAuthTokenRow.token_hash == token_hash)
            )
            await _announce_revoked(session, f"token:{token_hash}")

    async def delete_expired(self, now: float, *, keep_codes_s: float = 3600) -> int:
        """Also forgets codes that expired, once the hourly cap no longer counts them."""
        async with self._transaction() as session:
            result = await session.execute(
                sa.delete(OAuthTokenRow).where(OAuthTokenRow.expires_at < now)
            )
            await session.execute(
                sa.delete(OAuthCodeRow).where(
                    OAuthCodeRow.expires_at < now, OAuthCodeRow.created_at < now - keep_codes_s
                )
            )
            return int(getattr(result, "rowcount", 0) or 0)


def _token_row(token: TokenRecord) -> OAuthTokenRow:
    return OAuthTokenRow(
        token_hash=token.token_hash,
        grant_id=token.grant_id,
        role=token.role,
        expires_at=token.expires_at,
        rotated_at=token.rotated_at,
    )
