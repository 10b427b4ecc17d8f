"""Opaque tokens and their keyed hashes.

Tokens are random strings with a recognisable prefix (so a leaked one can be
found by secret scanners, and so that one kind can never pass for another);
the database holds only HMAC-SHA-256 of them under a server key, so a copy of
the database replays nothing, and lookup stays O(1).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Literal

TokenKind = Literal["at", "rt", "code"]
PREFIX = "smcp_"
KEY_BYTES = 32


class TokenHasher:
    def __init__(self, key: bytes) -> None:
        if len(key) < KEY_BYTES:
            raise ValueError(f"the token key must have at least {KEY_BYTES} bytes")
        self._key = key

    @staticmethod
    def mint(kind: TokenKind) -> str:
        # 32 random bytes: 256 bits, far above the 128 bits RFC 6749 section 10.10 asks.
        return f"{PREFIX}{kind}_{secrets.token_urlsafe(32)}"

    @staticmethod
    def kind_of(token: str) -> TokenKind | None:
        for kind in ("at", "rt", "code"):
            if token.startswith(f"{PREFIX}{kind}_"):
                return kind
        return None

    def digest(self, token: str) -> str:
        return hmac.new(self._key, token.encode(), hashlib.sha256).hexdigest()


def load_or_create_key(path: Path, given: str | None = None) -> bytes:
    """The HMAC key: from ``given`` (hex, from the environment), else from ``path``.

    At first start the key file is created with mode 0600 (O_EXCL, so two
    workers starting together cannot each write a different key).
    """
    if given:
        key = bytes.fromhex(given)
        if len(key) < KEY_BYTES:
            raise ValueError(
                f"the token key must be at least {KEY_BYTES} bytes ({2 * KEY_BYTES} hex)"
            )
        return key
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) < KEY_BYTES:
            raise ValueError(
                f"the token key file {path} is too short; delete it to make a new one"
            ) from None
        return key
    key = secrets.token_bytes(KEY_BYTES)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key)
    return key
