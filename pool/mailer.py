"""The one "your sandbox is ready" e-mail, for a user who left an address and had to wait.

Addresses live in memory only, keyed by sandbox key: never on disk, never in a
log line. One is forgotten as soon as its message is sent, or after 24 hours.
At most ``max_per_hour`` messages leave in any hour; beyond that none is sent
and the number skipped is logged.

With several server processes the address stays in the memory of the process
where the button was pressed, while the slot may be handed over by another: a
``ReadyRelay`` carries "this key's sandbox is ready" (as a hash of the key,
never the address) to every process, and the one holding the address sends it,
once. The hourly cap is then a shared budget (``take_mail_budget``), so the
processes together send at most ``max_per_hour``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Literal, Protocol

import aiosmtplib
import structlog

log = structlog.get_logger(__name__)

ADDRESS_TTL_S = 24 * 3600
# Deliberately simple: one @, no spaces or angle brackets, a dot in the domain.
_ADDRESS = re.compile(r"^[^@\s<>\"',;]{1,64}@[A-Za-z0-9.-]{1,253}\.[A-Za-z]{2,63}$")


def is_valid_address(address: str) -> bool:
    return len(address) <= 254 and bool(_ADDRESS.match(address))


@dataclass(frozen=True)
class SmtpOptions:
    host: str
    port: int
    security: Literal["starttls", "tls", "none"]
    sender: str
    username: str | None = None
    password: str | None = None
    timeout_s: float = 15.0


def key_hash(sandbox_key: str) -> str:
    """How a sandbox key is named to other processes (the key itself never travels)."""
    return hashlib.sha256(sandbox_key.encode()).hexdigest()


class ReadyRelay(Protocol):
    """Tells every server process that a key's sandbox is ready.

    On PostgreSQL: ``app.storage.slots.ready_relay``."""

    async def open(self, on_ready: Callable[[str], Awaitable[None]]) -> None:
        """Start delivering announcements (key hashes) to ``on_ready``."""
        ...

    async def announce(self, key_hash: str) -> None: ...

    async def close(self) -> None: ...


class ReadyMailer:
    """Remembers addresses and sends each at most one "ready" message."""

    def __init__(
        self,
        smtp: SmtpOptions | None,
        *,
        public_url: str,
        max_per_hour: int = 60,
        clock: Callable[[], float] | None = None,
        relay: ReadyRelay | None = None,
        take_mail_budget: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._smtp = smtp
        self._public_url = public_url
        self._max_per_hour = max_per_hour
        self._clock = clock or time.time
        self._relay = relay
        self._take_shared_budget = take_mail_budget
        # By the key's hash, so an announcement from another process finds it.
        self._addresses: dict[str, tuple[str, float]] = {}
        self._sent: deque[float] = deque()
        self._skipped = 0
        self._sending: set[asyncio.Task[None]] = set()

    @property
    def enabled(self) -> bool:
        return self._smtp is not None

    def remember(self, sandbox_key: str, address: str) -> bool:
        """Keep ``address`` for one message to ``sandbox_key``; False if it is unusable."""
        if self._smtp is None or not is_valid_address(address):
            return False
        self.purge()
        self._addresses[key_hash(sandbox_key)] = (address, self._clock() + ADDRESS_TTL_S)
        return True

    def has_address(self, sandbox_key: str) -> bool:
        return key_hash(sandbox_key) in self._addresses

    async def open(self) -> None:
        """Listen for hand-overs on other processes (when a relay is configured)."""
        if self._relay is not None and self._smtp is not None:
            await self._relay.open(self._send_if_held)

    async def housekeeping(self) -> None:
        self.purge()

    def purge(self) -> int:
        """Forget addresses older than 24 hours; returns how many."""
        now = self._clock()
        stale = [key for key, (_, until) in self._addresses.items() if until <= now]
        for key in stale:
            del self._addresses[key]
        return len(stale)

    async def sandbox_ready(self, sandbox_key: str) -> None:
        """The pool reserved a slot for this key: send its message in the background, or
        tell the other processes, one of which may hold the address."""
        if self._smtp is None:
            return
        hashed = key_hash(sandbox_key)
        if hashed in self._addresses or self._relay is None:
            await self._send_if_held(hashed)
        else:
            await self._relay.announce(hashed)

    async def _send_if_held(self, hashed: str) -> None:
        self.purge()
        entry = self._addresses.pop(hashed, None)
        if entry is None or self._smtp is None:
            return
        if not await self._take_budget():
            self._skipped += 1
            log.warning("mail.skipped_rate_limit", skipped_total=self._skipped)
            return
        task = asyncio.create_task(self._send(entry[0], self._smtp))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _take_budget(self) -> bool:
        if self._take_shared_budget is not None:
            return await self._take_shared_budget()
        now = self._clock()
        while self._sent and self._sent[0] <= now - 3600:
            self._sent.popleft()
        if len(self._sent) >= self._max_per_hour:
            return False
        self._sent.append(now)
        return True

    async def _send(self, address: str, smtp: SmtpOptions) -> None:
        message = EmailMessage()
        message["From"] = smtp.sender
        message["To"] = address
        message["Subject"] = "Your sandbox is ready"
        message.set_content(
            f"A sandbox on {self._public_url} is ready for you.\n\n"
            "Go back to your AI assistant and carry on: its next call gets the sandbox. "
            "The place is held for a limited time only.\n\n"
            "You receive this message once because you left this address on the sign-in "
            "page; it has now been deleted from the server.\n"
        )
        try:
            await aiosmtplib.send(
                message,
                hostname=smtp.host,
                port=smtp.port,
                username=smtp.username,
                password=smtp.password,
                use_tls=smtp.security == "tls",
                start_tls=smtp.security == "starttls",
                timeout=smtp.timeout_s,
            )
            log.info("mail.sent", kind="ready")
        except (aiosmtplib.SMTPException, OSError) as exc:
            # The address is gone either way: one attempt, no retries that could spam.
            log.warning("mail.failed", kind="ready", error=type(exc).__name__)

    async def close(self) -> None:
        """Wait for messages in flight, then forget every address."""
        if self._relay is not None:
            await self._relay.close()
        if self._sending:
            await asyncio.wait(self._sending, timeout=20)
        self._addresses.clear()
