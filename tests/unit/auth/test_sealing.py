"""Sealed sign-ins and codes: they open only unaltered, unexpired, under the same key
and as the kind they were sealed as."""

from __future__ import annotations

import base64

import pytest

from auth.pending import CODE_PREFIX, CodeGrant, PendingSignin
from auth.sealing import MAX_SEALED_CHARS, Sealer

KEY = b"k" * 32
NOW = 1_700_000_000.0


def a_code(**changes: object) -> CodeGrant:
    values: dict[str, object] = {
        "code_id": "id-1",
        "client_id": "client",
        "redirect_uri": "http://127.0.0.1:9/cb",
        "redirect_uri_given": True,
        "code_challenge": "c" * 43,
        "resource": "https://mcp.example.test/mcp",
        "scopes": ("sandbox",),
        "sandbox_key": "s" * 43,
        "expires_at": NOW + 600,
        "signin_prefix": "198.51.100.7",
    }
    return CodeGrant(**{**values, **changes})  # type: ignore[arg-type]


def test_a_sealed_code_opens_to_what_was_sealed() -> None:
    code = a_code()
    sealed = code.seal(Sealer(KEY))
    assert sealed.startswith(CODE_PREFIX)
    assert "s" * 43 not in sealed, "the content is secret"
    assert "198.51.100.7" not in sealed
    assert CodeGrant.unseal(Sealer(KEY), sealed, NOW) == code, "another process opens it"


def test_sealing_is_deterministic_for_equal_values_only() -> None:
    sealer = Sealer(KEY)
    assert a_code().seal(sealer) == a_code().seal(sealer), "a double press: the same code"
    assert a_code().seal(sealer) != a_code(signin_prefix="203.0.113.1").seal(sealer)


def test_an_expired_code_does_not_open() -> None:
    sealed = a_code().seal(Sealer(KEY))
    assert CodeGrant.unseal(Sealer(KEY), sealed, NOW + 599) is not None
    assert CodeGrant.unseal(Sealer(KEY), sealed, NOW + 600) is None


def test_another_servers_key_does_not_open_it() -> None:
    sealed = a_code().seal(Sealer(KEY))
    assert CodeGrant.unseal(Sealer(b"o" * 32), sealed, NOW) is None


@pytest.mark.parametrize("position", [len(CODE_PREFIX), len(CODE_PREFIX) + 20, -1])
def test_any_altered_character_makes_it_unopenable(position: int) -> None:
    sealed = a_code().seal(Sealer(KEY))
    index = position % len(sealed)
    altered = sealed[:index] + ("A" if sealed[index] != "A" else "B") + sealed[index + 1 :]
    assert CodeGrant.unseal(Sealer(KEY), altered, NOW) is None


def test_a_prolonged_expiry_cannot_be_forged() -> None:
    """The expiry is inside the authenticated text: re-sealing needs the key."""
    sealed = a_code().seal(Sealer(KEY))
    raw = base64.urlsafe_b64decode(sealed[len(CODE_PREFIX) :] + "==")
    flipped = raw[:-20] + bytes([raw[-20] ^ 1]) + raw[-19:]
    forged = CODE_PREFIX + base64.urlsafe_b64encode(flipped).rstrip(b"=").decode()
    assert CodeGrant.unseal(Sealer(KEY), forged, NOW) is None


def test_a_sign_in_does_not_open_as_a_code_nor_the_reverse() -> None:
    sealer = Sealer(KEY)
    pending = PendingSignin(
        csrf="x",
        client_id="client",
        client_name=None,
        redirect_uri="http://127.0.0.1:9/cb",
        redirect_uri_given=True,
        state="st",
        code_challenge="c" * 43,
        resource="https://mcp.example.test/mcp",
        scopes=("sandbox",),
        expires_at=NOW + 600,
        sandbox_key="s" * 43,
        code_id="id-1",
    )
    tx = pending.seal(sealer)
    assert PendingSignin.unseal(sealer, tx, NOW) == pending
    assert CodeGrant.unseal(sealer, CODE_PREFIX + tx, NOW) is None
    code = a_code().seal(sealer)
    assert PendingSignin.unseal(sealer, code[len(CODE_PREFIX) :], NOW) is None


@pytest.mark.parametrize(
    "junk", ["", "smcp_code_", "smcp_code_!!!", "smcp_code_" + "A" * 8, "smcp_code_é"]
)
def test_junk_is_refused_without_an_error(junk: str) -> None:
    assert CodeGrant.unseal(Sealer(KEY), junk, NOW) is None


def test_an_oversized_value_is_refused_before_decoding() -> None:
    assert Sealer(KEY).open("code", "A" * (MAX_SEALED_CHARS + 1), NOW) is None
