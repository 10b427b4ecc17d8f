"""Strict-Transport-Security on every response when the public URL is https (OAuth 2.1 1.5)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = (b"strict-transport-security", b"max-age=31536000")


class StrictTransportSecurity:
    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != HEADER[0]]
                message = {**message, "headers": [*headers, HEADER]}
            await send(message)

        await self._app(scope, receive, send_with_header)
