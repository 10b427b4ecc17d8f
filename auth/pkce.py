"""PKCE (RFC 7636), S256 only: OAuth 2.1 forbids ``plain``."""

from __future__ import annotations

import hmac

from authlib.oauth2.rfc7636.challenge import (
    CODE_CHALLENGE_PATTERN,
    CODE_VERIFIER_PATTERN,
    create_s256_code_challenge,
)


def is_valid_challenge(challenge: str) -> bool:
    # An S256 challenge is a base64url SHA-256: exactly 43 characters of the alphabet.
    return len(challenge) == 43 and bool(CODE_CHALLENGE_PATTERN.match(challenge))


def is_valid_verifier(verifier: str) -> bool:
    """43 to 128 characters of ``[A-Za-z0-9-._~]`` (RFC 7636 section 4.1)."""
    return bool(CODE_VERIFIER_PATTERN.match(verifier))


def verifier_matches(verifier: str, challenge: str) -> bool:
    return is_valid_verifier(verifier) and hmac.compare_digest(
        create_s256_code_challenge(verifier), challenge
    )
