from __future__ import annotations

import httpx2
import pytest

from app.root.main import build_app
from app.settings import load_settings


@pytest.mark.parametrize(
    ("public_url", "expected"), [("https://mcp.example.test", True), (None, False)]
)
async def test_every_answer_carries_hsts_only_behind_https(
    monkeypatch: pytest.MonkeyPatch, public_url: str | None, expected: bool
) -> None:
    if public_url:
        monkeypatch.setenv("SANDBOX_MCP_PUBLIC_URL", public_url)
    app = build_app(load_settings(pool_size=1))
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://t") as http:
        for path in ("/.well-known/oauth-authorization-server", "/nothing-here", "/mcp"):
            response = await http.get(path)
            assert ("strict-transport-security" in response.headers) is expected
        token = await http.post("/token", data={"grant_type": "x"})
        assert ("strict-transport-security" in token.headers) is expected
