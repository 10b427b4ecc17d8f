"""The "ready" e-mail with several processes on one PostgreSQL: the address stays where
the button was pressed, the process that hands the slot over tells the others, the
holder sends once, and the hourly cap holds for all of them together. Two mailers
with their own relay connections stand for two processes; real PostgreSQL, real SMTP
(aiosmtpd on loopback)."""

from __future__ import annotations

import asyncio
import email
import socket
from collections.abc import AsyncIterator, Iterator
from email.message import Message

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session
from pg_testkit import fresh_database

from app.shared_limits import SharedLimits
from app.storage.db import create_engine, upgrade_schema
from pool.mailer import ReadyMailer, SmtpOptions

pytestmark = pytest.mark.integration


class Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[list[str], Message]] = []
        self.arrived = asyncio.Event()

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content if isinstance(envelope.content, bytes) else b""
        self.messages.append((list(envelope.rcpt_tos), email.message_from_bytes(content)))
        return "250 OK"

    def to(self, address: str) -> int:
        return sum(address in rcpts for rcpts, _ in self.messages)

    async def wait_for(self, address: str) -> None:
        for _ in range(200):  # 10 s at most, done as soon as it arrives
            if self.to(address):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"no message to {address}")


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


@pytest.fixture
def database_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


async def processes(
    database_url: str, port: int, count: int, per_hour: int
) -> AsyncIterator[list[ReadyMailer]]:
    engine = create_engine(database_url)
    await upgrade_schema(engine)
    mailers = []
    for _ in range(count):
        shared = SharedLimits.build(engine, database_url, per_hour)
        mailer = ReadyMailer(
            SmtpOptions("127.0.0.1", port, "none", "sandbox@example.test"),
            public_url="https://mcp.example.test",
            max_per_hour=per_hour,
            relay=shared.relay,
            take_mail_budget=shared.take_mail,
        )
        await mailer.open()
        mailers.append(mailer)
    try:
        yield mailers
    finally:
        for mailer in mailers:
            await mailer.close()
        await engine.dispose()


async def test_the_holder_sends_once_when_another_process_hands_the_slot_over(
    smtp: tuple[Inbox, int], database_url: str
) -> None:
    inbox, port = smtp
    async for signed_in_here, hands_over in processes(database_url, port, 2, 60):
        assert signed_in_here.remember("waiter-key", "waiter@example.org")
        assert signed_in_here.remember("other-key", "other@example.org")
        assert not hands_over.has_address("waiter-key"), "the address stays where it was left"
        await hands_over.sandbox_ready("waiter-key")
        await inbox.wait_for("waiter@example.org")
        await hands_over.sandbox_ready("waiter-key")  # handed over again: no second message
        await hands_over.sandbox_ready("other-key")
        await inbox.wait_for("other@example.org")  # announced after the repeat: it passed
        assert inbox.to("waiter@example.org") == 1
        assert not signed_in_here.has_address("waiter-key"), "deleted once sent"
        _, message = inbox.messages[0]
        assert message["Subject"] == "Your sandbox is ready"


async def test_the_hourly_cap_holds_across_processes(
    smtp: tuple[Inbox, int], database_url: str
) -> None:
    inbox, port = smtp
    async for first, second in processes(database_url, port, 2, 2):
        for number, mailer in enumerate([first, second, first, second]):
            assert mailer.remember(f"key-{number}", f"user{number}@example.org")
            await mailer.sandbox_ready(f"key-{number}")
        await first.close()
        await second.close()  # waits for the messages in flight
        assert len(inbox.messages) == 2, "two processes together sent at most the cap"
