"""The "ready" e-mail against a real SMTP server (aiosmtpd on loopback)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from pool_fakes import FakeSlotStore, MemoryPoolState
from smtp_testkit import Inbox

from pool.leases import Queued, SlotPool
from pool.mailer import ReadyMailer, SmtpOptions

pytestmark = pytest.mark.integration


@pytest.fixture
async def pool_and_mailer(
    smtp: tuple[Inbox, int],
) -> AsyncIterator[tuple[SlotPool, ReadyMailer, Inbox]]:
    inbox, port = smtp
    mailer = ReadyMailer(
        SmtpOptions("127.0.0.1", port, "none", "sandbox@example.test"),
        public_url="https://mcp.example.test",
    )
    pool = SlotPool(
        MemoryPoolState(),
        FakeSlotStore(),
        size=1,
        idle_timeout_s=600,
        on_reserved=mailer.sandbox_ready,
    )
    await pool.open()
    yield pool, mailer, inbox
    await mailer.close()


async def test_queued_user_gets_exactly_one_ready_message(
    pool_and_mailer: tuple[SlotPool, ReadyMailer, Inbox],
) -> None:
    pool, mailer, inbox = pool_and_mailer
    await pool.acquire("holder")
    with pytest.raises(Queued):
        await pool.acquire("waiter")
    assert mailer.remember("waiter", "waiter@example.org")
    await pool.release("holder")
    await inbox.arrival(1)
    await mailer.close()
    assert len(inbox.received) == 1
    message = inbox.received[0].message
    assert inbox.received[0].recipients == ["waiter@example.org"]
    assert message["Subject"] == "Your sandbox is ready"
    assert "https://mcp.example.test" in message.get_payload()  # type: ignore[operator]
    assert not mailer.has_address("waiter")  # deleted once sent

    # A second reservation for the same key sends nothing: the address is gone.
    assert (await pool.acquire("waiter")).notes == ("ready",)
    await pool.release("waiter")
    await pool.acquire("holder")
    with pytest.raises(Queued):
        await pool.acquire("waiter")
    await pool.release("holder")
    assert (await pool.acquire("waiter")).notes == ("ready",)
    await asyncio.sleep(0.3)
    assert len(inbox.received) == 1


async def test_at_most_max_per_hour_messages_leave(smtp: tuple[Inbox, int]) -> None:
    inbox, port = smtp
    mailer = ReadyMailer(
        SmtpOptions("127.0.0.1", port, "none", "s@example.test"),
        public_url="https://x.test",
        max_per_hour=3,
    )
    for i in range(5):
        assert mailer.remember(f"k{i}", f"u{i}@example.org")
        await mailer.sandbox_ready(f"k{i}")
    await mailer.close()
    assert len(inbox.received) == 3


def test_addresses_are_validated_and_expire_after_a_day() -> None:
    now = [0.0]
    mailer = ReadyMailer(
        SmtpOptions("127.0.0.1", 25, "none", "s@example.test"),
        public_url="https://x.test",
        clock=lambda: now[0],
    )
    for bad in ("nope", "a@b", "a b@example.org", "<a@example.org>", "x" * 300 + "@example.org"):
        assert not mailer.remember("k", bad)
    assert mailer.remember("k", "ok@example.org")
    now[0] += 24 * 3600 + 1
    assert mailer.purge() == 1
    assert not mailer.has_address("k")


def test_without_smtp_nothing_is_remembered() -> None:
    mailer = ReadyMailer(None, public_url="https://x.test")
    assert not mailer.enabled
    assert not mailer.remember("k", "ok@example.org")
