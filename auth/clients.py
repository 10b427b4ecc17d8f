"""Who a ``client_id`` names: a registered client, or the owner of a metadata document URL."""

from __future__ import annotations

from urllib.parse import urlsplit

from auth.client_documents import ClientDocuments, DocumentRefused, is_url_client_id
from auth.log_sampling import refusals
from auth.store import AuthStore, Client


class UnknownClient(Exception):
    """No usable client; ``reason`` is shown to the person on the local error page."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ClientDirectory:
    def __init__(self, store: AuthStore, documents: ClientDocuments | None) -> None:
        self._store = store
        self._documents = documents

    async def for_authorization(
        self, client_id: str, *, prefix: str = "", may_fetch: bool = True
    ) -> Client:
        """The client starting a sign-in. A URL client ID is (re)read from its document,
        respecting the document's cache lifetime, and stored so grants can name it.

        When the document cannot be fetched for a reason that says nothing about it
        (the fetch budget is spent, its host is down, or ``may_fetch`` is False) and no
        copy is in memory (a restart), a client that completed a sign-in before is
        served from its stored row: its last good document. ``prefix`` is the budget
        key of the browser (see ClientDocuments.client).

        Raises:
            UnknownClient: never registered, or its document was refused.
        """
        if not client_id:
            raise UnknownClient("The request names no application (client_id is missing).")
        if not is_url_client_id(client_id):
            client = await self._store.load_client(client_id)
            if client is None:
                raise UnknownClient(
                    "The application that sent you here is not registered with this server. "
                    "Go back to it and connect again."
                )
            return client
        if self._documents is None:
            raise UnknownClient(
                "This server does not accept client metadata documents; "
                "the application has to register instead."
            )
        try:
            client = await self._documents.client(client_id, prefix=prefix, may_fetch=may_fetch)
        except DocumentRefused as exc:
            stored = await self._store.load_client(client_id) if exc.transient else None
            if stored is not None and stored.last_grant_at is not None:
                refusals.warning(
                    "oauth.client_document_from_store",
                    prefix,
                    host=urlsplit(client_id).hostname,
                    reason=exc.reason,
                )
                return stored
            raise UnknownClient(
                f"The application's metadata document was refused: {exc.reason}"
            ) from None
        await self._store.upsert_client(client)
        return client
