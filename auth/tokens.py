"""Opaque tokens and their keyed hashes.

Tokens are random strings with a recognisable prefix (so a leaked one can be
found by secret scanners, and so that one kind can never pass for another);
the database holds only HMAC-SHA-256 of them under a server key, so a copy of
the database replays nothing, and lookup stays O(1).

Each token ends in a short tag, an HMAC of the rest under a key derived from
the server key: a made-up token is told apart in a microsecond, without a
database trip, so a flood of bogus bearer tokens costs the database nothing
(and needs no per-address limit, which would hurt users behind Claude's shared
addresses). The tag is a filter, not the security: a token is valid only if its
hash is in the database.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Literal

TokenKind = Literal["at", "rt", "code"]
PREFIX = "smcp_"
KEY_BYTES = 32
_RANDOM_CHARS = 43  # secrets.token_urlsafe(32)
_TAG_BYTES = 8
_TAG_CHARS = 11  # base64url of 8 bytes, unpadded


class TokenHasher:
    def __init__(self, key: bytes) -> None:
        if len(key) < KEY_BYTES:
            raise ValueError(f"the token key must have at least {KEY_BYTES} bytes")
        self._key = key
        # Domain-separated from the digest key, so a tag says nothing about a stored hash.
        self._tag_key = hmac.new(key, b"sandbox-mcp token tag", hashlib.sha256).digest()
        self._successor_key = hmac.new(key, b"sandbox-mcp token successor", hashlib.sha256).digest()

    def mint(self, kind: TokenKind) -> str:
        # 32 random bytes: 256 bits, far above the 128 bits RFC 6749 section 10.10 asks.
        body = f"{PREFIX}{kind}_{secrets.token_urlsafe(32)}"
        return body + self._tag(body)

    def successor(self, kind: TokenKind, token: str) -> str:
        """The ``kind`` token that rotating ``token`` yields: the same on every process.

        A refresh raced on two processes must give one pair, and the pair cannot be
        stored (token values never are): so it is derived from the rotated-out token,
        which only its holder has, under a key only the servers have.
        """
        seed = hmac.new(self._successor_key, f"{kind}\0{token}".encode(), hashlib.sha256)
        random_part = base64.urlsafe_b64encode(seed.digest()).rstrip(b"=").decode()
        body = f"{PREFIX}{kind}_{random_part}"
        return body + self._tag(body)

    def _tag(self, body: str) -> str:
        mac = hmac.new(self._tag_key, body.encode(), hashlib.sha256).digest()[:_TAG_BYTES]
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def kind_of(self, token: str) -> TokenKind | None:
        """The kind of a token this server minted, or None for anything else: another
        shape, another server's key, or a made-up or altered token."""
        if not token.isascii():  # compare_digest refuses non-ASCII text with a TypeError
            return None
        for kind in ("at", "rt", "code"):
            prefix = f"{PREFIX}{kind}_"
            if token.startswith(prefix):
                if len(token) != len(prefix) + _RANDOM_CHARS + _TAG_CHARS:
                    return None
                body, tag = token[:-_TAG_CHARS], token[-_TAG_CHARS:]
                return kind if hmac.compare_digest(tag, self._tag(body)) else None
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
