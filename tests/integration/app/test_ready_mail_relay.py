"""The "ready" e-mail with several processes on one PostgreSQL: the address stays where
the button was pressed, the process that hands the slot over tells the others, the
holder sends once, and the hourly cap holds for all of them together. Two mailers
with their own relay connections stand for two processes; real PostgreSQL, real SMTP
(aiosmtpd on loopback)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from smtp_testkit import Inbox

from app.root.shared_limits import SharedLimits
from app.storage.db import create_engine, upgrade_schema
from pool.mailer import ReadyMailer, SmtpOptions

pytestmark = pytest.mark.integration


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
        await inbox.arrival(to="waiter@example.org")
        await hands_over.sandbox_ready("waiter-key")  # handed over again: no second message
        await hands_over.sandbox_ready("other-key")
        await inbox.arrival(to="other@example.org")  # announced after the repeat: it passed
        assert inbox.to("waiter@example.org") == 1
        assert not signed_in_here.has_address("waiter-key"), "deleted once sent"
        message = inbox.received[0].message
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
        assert len(inbox.received) == 2, "two processes together sent at most the cap"
