"""Sealed values: what a sign-in in progress and an authorization code stand for,
carried by the client instead of kept by the server.

Several server processes serve one database, and any of them may receive the
next step of a sign-in, so a pending sign-in and a code cannot live in one
process's memory; the seed promises they are never stored either. So they
travel sealed: JSON under AES-256-GCM (authenticated: a changed byte, another
server's key or another kind of value fails to open), with a key derived from
the token key by HKDF under a label of its own, so the token key itself is never
used for two jobs. Every process with the same token key opens what any other
sealed.

The nonce is an HMAC of the plaintext (a synthetic IV, as in SIV): sealing the
same value twice gives the same text, which a double press needs (the same
redirect, the same code), and two different values never share a nonce.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any, Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

SealedKind = Literal["signin", "code"]
_NONCE_BYTES = 12
# Above the longest sign-in (a 2,048-character state, long client id and redirect URI)
# and within the 16 KB form of the button; anything longer is refused before decoding.
MAX_SEALED_CHARS = 16_000


def _derive(key: bytes, label: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label).derive(key)


class Sealer:
    def __init__(self, token_key: bytes) -> None:
        self._aead = AESGCM(_derive(token_key, b"sandbox-mcp sealed sign-ins v1"))
        self._nonce_key = _derive(token_key, b"sandbox-mcp sealed sign-ins nonce v1")

    def seal(self, kind: SealedKind, value: Mapping[str, Any], expires_at: float) -> str:
        """``value`` (JSON-able) with its expiry, sealed; URL- and form-safe text."""
        plaintext = json.dumps(
            {"v": dict(value), "exp": expires_at},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,  # UTF-8: a non-ASCII state grows by 4 bytes a character, not 12
        ).encode()
        aad = kind.encode()
        nonce = hmac.new(self._nonce_key, aad + b"\0" + plaintext, hashlib.sha256).digest()
        nonce = nonce[:_NONCE_BYTES]
        sealed = nonce + self._aead.encrypt(nonce, plaintext, aad)
        return base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()

    def open(self, kind: SealedKind, text: str, now: float) -> dict[str, Any] | None:
        """The value sealed as ``kind``, or None: expired, altered, sealed under another
        key or as another kind, or not a sealed value at all."""
        if not text or len(text) > MAX_SEALED_CHARS or not text.isascii():
            return None
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            return None
        # Only the canonical text: unpadded base64 leaves spare bits in its last
        # character, and a value must have exactly one spelling.
        if len(raw) <= _NONCE_BYTES or base64.urlsafe_b64encode(raw).rstrip(b"=") != text.encode():
            return None
        nonce, body = raw[:_NONCE_BYTES], raw[_NONCE_BYTES:]
        try:
            plaintext = self._aead.decrypt(nonce, body, kind.encode())
        except InvalidTag:
            return None
        opened = json.loads(plaintext)
        if not isinstance(opened, dict) or float(opened.get("exp", 0)) <= now:
            return None
        value = opened.get("v")
        return value if isinstance(value, dict) else None
