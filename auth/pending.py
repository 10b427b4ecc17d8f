"""Sign-ins in progress and authorization codes: never stored, carried sealed by the client.

A pending sign-in travels in the sign-in page's ``tx`` form field and a code
in the redirect, each sealed (``auth.sealing``), so whichever server process
receives the next step can open it and none keeps it. Neither ever reaches a
log line (a code is a credential for ten minutes). The database knows a code
only by the keyed hash of its random ``code_id``, with its expiry and address
prefix: enough to enforce single use and the admission caps across processes,
never enough to redeem it.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, Generic, TypeVar

from auth.sealing import Sealer

V = TypeVar("V")
CODE_PREFIX = "smcp_code_"


@dataclass(frozen=True)
class PendingSignin:
    """An /authorize request waiting for the user to press the button.

    ``sandbox_key`` and ``code_id`` are chosen when the page is shown, so a
    double press (claude-ai-mcp#562), on any process, gives the same answer.
    """

    csrf: str
    client_id: str
    client_name: str | None
    redirect_uri: str
    redirect_uri_given: bool
    state: str | None
    code_challenge: str
    resource: str
    scopes: tuple[str, ...]
    expires_at: float
    sandbox_key: str
    code_id: str

    def seal(self, sealer: Sealer) -> str:
        return sealer.seal("signin", asdict(self), self.expires_at)

    @classmethod
    def unseal(cls, sealer: Sealer, tx: str, now: float) -> PendingSignin | None:
        return _from_value(cls, sealer.open("signin", tx, now))


@dataclass(frozen=True)
class CodeGrant:
    """What an authorization code stands for, until it expires (redeemable once)."""

    code_id: str
    client_id: str
    redirect_uri: str
    redirect_uri_given: bool
    code_challenge: str
    resource: str
    scopes: tuple[str, ...]
    sandbox_key: str
    expires_at: float
    signin_prefix: str | None = None

    def seal(self, sealer: Sealer) -> str:
        return CODE_PREFIX + sealer.seal("code", asdict(self), self.expires_at)

    @classmethod
    def unseal(cls, sealer: Sealer, code: str, now: float) -> CodeGrant | None:
        if not code.startswith(CODE_PREFIX):
            return None
        return _from_value(cls, sealer.open("code", code[len(CODE_PREFIX) :], now))


T = TypeVar("T", PendingSignin, CodeGrant)


def _from_value(cls: type[T], value: dict[str, Any] | None) -> T | None:
    if value is None:
        return None
    names = {f.name for f in fields(cls)}
    if set(value) != names:
        return None  # sealed by another version of this code: treat as unknown
    value["scopes"] = tuple(value["scopes"])
    return cls(**value)


class ExpiringMap(Generic[V]):
    """A bounded, insertion-ordered map whose values expire (``expires_at``)."""

    def __init__(self, capacity: int, clock: Callable[[], float] = time.time) -> None:
        self.capacity = capacity
        self._clock = clock
        self._items: OrderedDict[str, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def purge(self) -> None:
        now = self._clock()
        for key in [k for k, (until, _) in self._items.items() if until <= now]:
            del self._items[key]

    def has_room(self) -> bool:
        if len(self._items) >= self.capacity:
            self.purge()
        return len(self._items) < self.capacity

    def put(self, key: str, value: V, expires_at: float) -> None:
        self._items[key] = (expires_at, value)

    def put_evicting(self, key: str, value: V, expires_at: float) -> None:
        """Put, making room by dropping the oldest entry: for caches, where losing one is fine."""
        self._items.pop(key, None)
        if not self.has_room():
            self._items.popitem(last=False)
        self._items[key] = (expires_at, value)

    def get(self, key: str) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] <= self._clock():
            del self._items[key]
            return None
        return item[1]

    def touch(self, key: str) -> None:
        """Mark an entry as recently used: ``put_evicting`` drops it last."""
        if key in self._items:
            self._items.move_to_end(key)

    def pop(self, key: str) -> V | None:
        value = self.get(key)
        self._items.pop(key, None)
        return value


def new_id() -> str:
    return secrets.token_urlsafe(24)  # 192 bits
