"""Token shape and tag: a made-up token is refused without a database trip."""

from __future__ import annotations

from typing import Any

import pytest

from auth.config import AuthConfig
from auth.grants import TokenService
from auth.sealing import Sealer
from auth.store import Client
from auth.tokens import TokenHasher

KEY = b"k" * 32


@pytest.mark.parametrize("kind", ["at", "rt", "code"])
def test_minted_tokens_carry_their_kind_and_are_recognised(kind: str) -> None:
    hasher = TokenHasher(KEY)
    token = hasher.mint(kind)  # type: ignore[arg-type]
    assert token.startswith(f"smcp_{kind}_")
    assert hasher.kind_of(token) == kind
    assert hasher.mint(kind) != token  # type: ignore[arg-type]


def _flip(char: str) -> str:
    return "A" if char != "A" else "B"


@pytest.mark.parametrize(
    "forge",
    [
        lambda t: t[:-1] + _flip(t[-1]),  # altered tag
        lambda t: t[:12] + _flip(t[12]) + t[13:],  # altered random part
        lambda t: t[:-11],  # no tag: the old, untagged shape
        lambda t: t + "A",  # too long
        lambda t: "smcp_rt_" + t[len("smcp_at_") :],  # another kind's prefix
        lambda t: "smcp_at_" + "A" * 54,  # made up, right length
    ],
)
def test_altered_or_made_up_tokens_are_not_recognised(forge: Any) -> None:
    hasher = TokenHasher(KEY)
    assert hasher.kind_of(forge(hasher.mint("at"))) is None


def test_another_servers_tokens_are_not_recognised() -> None:
    assert TokenHasher(KEY).kind_of(TokenHasher(b"o" * 32).mint("at")) is None


class NoDatabase:
    """A store that fails the test if anything reaches it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was asked for {name}")


async def test_made_up_tokens_never_reach_the_store() -> None:
    hasher = TokenHasher(KEY)
    tokens = TokenService(
        AuthConfig(issuer="https://mcp.example.test"),
        NoDatabase(),  # type: ignore[arg-type]
        hasher,
        Sealer(KEY),
    )
    made_up = "smcp_at_" + "x" * 54
    assert await tokens.verify_token(made_up) is None
    assert await tokens.verify_token(TokenHasher(b"o" * 32).mint("at")) is None
    client = Client("c", None, ("https://a.test/cb",), 0.0)
    await tokens.revoke(client, "smcp_rt_" + "y" * 54)  # ignored, as RFC 7009 says
    with pytest.raises(Exception, match="unknown"):
        await tokens.refresh(client, {"refresh_token": "smcp_rt_" + "y" * 54})
    # Made-up, altered or foreign codes fail to open: no database trip either.
    for code in ["smcp_code_" + "z" * 300, "x", "smcp_code_" + "A" * 20_000]:
        with pytest.raises(Exception, match="unknown or has expired"):
            await tokens.exchange_code(client, {"code": code, "code_verifier": "v" * 43})


def test_a_token_with_non_ascii_characters_is_refused_not_a_crash() -> None:
    hasher = TokenHasher(KEY)
    token = hasher.mint("at")
    assert hasher.kind_of(token[:-1] + "\u00e9") is None
    assert hasher.kind_of("smcp_at_" + "\u00e9" * 54) is None
