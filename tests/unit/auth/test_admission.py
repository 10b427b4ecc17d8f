"""The sign-in admission caps, on the real SQL store: live sandboxes per address prefix
(grants from the store plus codes not yet redeemed), the per-minute burst and the
server-wide hourly cap."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from db_testkit import migrated_sqlite
from fetch_testkit import Clock
from oauth_browser import authorization_request, pkce_pair, query_of
from signin_testkit import flow_and_tokens, registered_client

from app.storage.signin.auth_store import SqlAuthStore
from auth.admission import Refusal, SigninAdmission
from auth.config import AuthConfig
from auth.grants import TokenService
from auth.signin import SigninFlow
from auth.store import Client

REDIRECT = "http://127.0.0.1:9/cb"
HOME = "2001:db8:1:2::/64"
ELSEWHERE = "198.51.100.7"


@dataclass
class Front:
    clock: Clock
    config: AuthConfig
    store: SqlAuthStore
    flow: SigninFlow
    tokens: TokenService
    admission: SigninAdmission
    client: Client

    async def press(self, prefix: str) -> tuple[str, str] | None:
        """One checked press as the handler does it: None if refused, else (code, verifier)."""
        verifier, challenge = pkce_pair()
        pending = await self.flow.start(
            authorization_request(self.client.client_id, REDIRECT, challenge)
        )
        pressed = self.flow.pressed(pending.tx, pending.csrf, pending.csrf)
        admitted = await self.admission.admit(self.flow.issued_code(pressed, prefix))
        if isinstance(admitted, Refusal):
            return None
        approval = self.flow.approve(pressed, "", admitted.issued, first=admitted.first)
        assert approval.code is not None
        return query_of(approval.location)["code"], verifier

    async def sign_in(self, prefix: str) -> dict[str, object]:
        pressed = await self.press(prefix)
        assert pressed is not None, "refused"
        code, verifier = pressed
        form = {
            "client_id": self.client.client_id,
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": REDIRECT,
        }
        return await self.tokens.exchange_code(self.client, form)


async def front_with(tmp_path: Path, **limits: int) -> AsyncIterator[Front]:
    engine = await migrated_sqlite(tmp_path)
    clock = Clock()
    config = AuthConfig(issuer="https://mcp.example.test", **limits)  # type: ignore[arg-type]
    store = SqlAuthStore(engine)
    flow, tokens = flow_and_tokens(config, store, clock)
    client = await registered_client(store, clock, REDIRECT)
    yield Front(
        clock, config, store, flow, tokens, SigninAdmission(config, store, clock=clock), client
    )
    await engine.dispose()


@pytest.fixture
async def front(tmp_path: Path) -> AsyncIterator[Front]:
    async for made in front_with(
        tmp_path, sandboxes_per_address=2, signins_per_address_per_minute=100
    ):
        yield made


async def test_live_sandboxes_per_prefix_count_grants_and_unredeemed_codes(front: Front) -> None:
    await front.sign_in(HOME)  # a grant in the store
    assert await front.press(HOME) is not None  # a code, not yet redeemed
    refusal = await front.admission.check(HOME)
    assert refusal is not None
    assert "already has 2 signed-in sandboxes" in refusal.message
    assert "(2)" in refusal.message
    # The code expires in 10 minutes: that is when the place frees.
    assert 590 <= refusal.retry_after_s <= 601
    assert await front.admission.check(ELSEWHERE) is None, "another network is not affected"


async def test_the_cap_survives_a_restart_and_frees_on_revocation(front: Front) -> None:
    first = await front.sign_in(HOME)
    await front.sign_in(HOME)
    restarted = SigninAdmission(front.config, front.store, clock=front.clock)
    refusal = await restarted.check(HOME)
    assert refusal is not None, "the grants are in the store, not in memory"
    assert refusal.retry_after_s > 29 * 86400, "they expire with their refresh tokens"
    await front.tokens.revoke(front.client, str(first["refresh_token"]))
    assert await restarted.check(HOME) is None


async def test_expired_sign_ins_and_expired_codes_stop_counting(front: Front) -> None:
    await front.sign_in(HOME)
    assert await front.press(HOME) is not None
    front.clock.now += 601  # the code expired unredeemed
    assert await front.admission.check(HOME) is None
    assert await front.press(HOME) is not None
    front.clock.now += front.config.refresh_ttl_s + 1  # every refresh token expired
    assert await front.admission.check(HOME) is None


async def test_refreshing_keeps_one_sandbox_one_place(front: Front) -> None:
    pair = await front.sign_in(HOME)
    for _ in range(3):
        form = {"client_id": front.client.client_id, "refresh_token": str(pair["refresh_token"])}
        pair = await front.tokens.refresh(front.client, form)
    assert await front.admission.check(HOME) is None, "one grant, however often refreshed"


async def test_the_burst_per_minute_is_per_prefix(tmp_path: Path) -> None:
    async for front in front_with(tmp_path, signins_per_address_per_minute=2):
        assert await front.press(HOME) is not None
        assert await front.press(HOME) is not None
        refusal = await front.admission.check(HOME)
        assert refusal is not None
        assert "in the last minute" in refusal.message
        assert await front.press(ELSEWHERE) is not None
        front.clock.now += 61
        assert await front.press(HOME) is not None


async def test_new_sandboxes_per_hour_are_capped_server_wide(tmp_path: Path) -> None:
    async for front in front_with(tmp_path, new_sandboxes_per_hour=3):
        for network in ("198.51.100.1", "192.0.2.1", "2001:db8:5::/64"):
            await front.sign_in(network)
        refusal = await front.admission.check("203.0.113.1")
        assert refusal is not None
        assert "at most 3 new sandboxes an hour" in refusal.message
        assert "Try again in 60 minutes" in refusal.message
        assert 3590 <= refusal.retry_after_s <= 3601
        front.clock.now += 3601
        assert await front.press("203.0.113.1") is not None


async def test_a_code_not_redeemed_frees_its_place_in_the_hour_when_it_expires(
    tmp_path: Path,
) -> None:
    async for front in front_with(tmp_path, new_sandboxes_per_hour=1):
        assert await front.press(HOME) is not None
        refusal = await front.admission.check(ELSEWHERE)
        assert refusal is not None, "held while it may still be redeemed"
        assert refusal.limit == "hourly"
        assert 590 <= refusal.retry_after_s <= 601, "until the code expires, not for the hour"
        front.clock.now += front.config.code_ttl_s + 1
        assert await front.admission.check(ELSEWHERE) is None


async def test_one_network_and_one_address_take_only_their_share_of_the_hour(
    tmp_path: Path,
) -> None:
    async for front in front_with(tmp_path, new_sandboxes_per_hour=20):
        # 20 an hour: one address may take 5% (1), one network 10% (2).
        await front.sign_in("2001:db8:9:1::/64")
        refusal = await front.admission.check("2001:db8:9:1::/64")
        assert refusal is not None
        assert refusal.limit == "hourly_address"
        await front.sign_in("2001:db8:9:2::/64")
        refusal = await front.admission.check("2001:db8:9:3::/64")
        assert refusal is not None
        assert refusal.limit == "hourly_network"
        assert "2001:db8:9::/48" in refusal.message
        assert await front.admission.check("2001:db8:a:1::/64") is None, "the next /48"


async def test_a_refused_press_spends_nothing(tmp_path: Path) -> None:
    async for front in front_with(tmp_path, new_sandboxes_per_hour=1, sandboxes_per_address=1):
        await front.sign_in(HOME)
        for _ in range(5):
            assert await front.press(HOME) is None  # over the live cap
        front.clock.now += 601  # the code expired; the hour has not passed
        refusal = await front.admission.check(ELSEWHERE)
        assert refusal is not None
        assert "an hour" in refusal.message, "only the one admitted press was counted"
