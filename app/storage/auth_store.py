"""``auth.store.AuthStore`` on the service's database (SQLAlchemy)."""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from typing import cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.db import Base, transaction
from auth.store import Client, Grant, TokenRecord, TokenRole


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


class SqlAuthStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

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
            insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
            statement = insert(OAuthClientRow).values(
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

    async def live_grant_expiries(self, signin_prefix: str, now: float) -> list[float]:
        async with self._transaction() as session:
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

    async def delete_token(self, token_hash: str) -> None:
        async with self._transaction() as session:
            await session.execute(
                sa.delete(OAuthTokenRow).where(OAuthTokenRow.token_hash == token_hash)
            )

    async def delete_expired(self, now: float) -> int:
        async with self._transaction() as session:
            result = await session.execute(
                sa.delete(OAuthTokenRow).where(OAuthTokenRow.expires_at < now)
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
