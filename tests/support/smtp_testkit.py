"""A real SMTP server on loopback (aiosmtpd) in each of the server's security modes:
``none`` (plain), ``starttls`` (plain, then upgraded; login required) and ``tls``
(TLS from the first byte; login required). It records every message and how its
session was secured."""

from __future__ import annotations

import asyncio
import email
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import Message
from typing import Any, Literal

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from tls_testkit import ThrowawayCA

Security = Literal["none", "starttls", "tls"]
USER, PASSWORD = "mailer", "smtp-pass-8841"


@dataclass
class Received:
    recipients: list[str]
    message: Message
    over_tls: bool
    login: str | None


@dataclass
class Inbox:
    received: list[Received] = field(default_factory=list)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content if isinstance(envelope.content, bytes) else b""
        login = session.auth_data.decode() if session.authenticated else None
        self.received.append(
            Received(
                list(envelope.rcpt_tos),
                email.message_from_bytes(content),
                over_tls=server.transport is not None
                and server.transport.get_extra_info("ssl_object") is not None,
                login=login,
            )
        )
        return "250 OK"

    def wait_for(self, count: int, timeout_s: float) -> list[Received]:
        """The messages, once ``count`` have arrived (or what came by ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.1)
        return list(self.received)

    def to(self, address: str) -> int:
        """How many of the messages went to ``address``."""
        return sum(address in message.recipients for message in self.received)

    async def arrival(
        self, count: int = 1, *, to: str | None = None, timeout_s: float = 10
    ) -> None:
        """Until ``count`` messages (to ``to``, if given) have arrived, without blocking the
        event loop that sends them; AssertionError past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (self.to(to) if to else len(self.received)) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} message(s) {f'to {to} ' if to else ''}never came")
            await asyncio.sleep(0.05)


def _authenticate(
    server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
) -> AuthResult:
    ok = isinstance(data, LoginPassword) and (data.login, data.password) == (
        USER.encode(),
        PASSWORD.encode(),
    )
    return AuthResult(success=ok, handled=False, auth_data=USER.encode() if ok else None)


@contextmanager
def smtp_server(security: Security, ca: ThrowawayCA | None = None) -> Iterator[tuple[Inbox, int]]:
    """An SMTP server on 127.0.0.1; ``ca`` is needed for ``starttls`` and ``tls``."""
    inbox = Inbox()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options: dict[str, Any] = {}
    if security != "none":
        assert ca is not None, "TLS modes need a certificate"
        options = {
            "authenticator": _authenticate,
            "auth_required": True,
            # aiosmtpd knows of TLS only through STARTTLS: with implicit TLS the login
            # is refused as "not encrypted" unless told otherwise.
            "auth_require_tls": security == "starttls",
        }
    if security == "starttls":
        options |= {"tls_context": ca.server_context(), "require_starttls": True}
    controller = Controller(
        inbox,
        hostname="127.0.0.1",
        port=port,
        ssl_context=ca.server_context() if security == "tls" and ca else None,
        server_hostname="127.0.0.1",
        **options,
    )
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()
