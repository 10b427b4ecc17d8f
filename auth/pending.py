"""Sign-ins in progress and authorization codes: memory only, bounded, short-lived.

Neither ever touches the disk or a log line (an authorization code is a
credential for ten minutes). Both are keyed by random values of at least 128
bits; codes are kept by their keyed hash, like tokens.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass
class PendingSignin:
    """An /authorize request waiting for the user to press the button."""

    tx: str
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
    # Set once approved: a second press (double submit) gets the same answer.
    location: str | None = None


@dataclass
class CodeGrant:
    """What an authorization code stands for, until it is redeemed and then expires."""

    client_id: str
    redirect_uri: str
    redirect_uri_given: bool
    code_challenge: str
    resource: str
    scopes: tuple[str, ...]
    sandbox_key: str
    expires_at: float
    signin_prefix: str | None = None
    # The grant its first redemption created; a second redemption revokes it.
    redeemed_grant: str | None = None
    redeeming: bool = field(default=False)


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
