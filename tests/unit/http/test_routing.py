"""The HTTP app's router: ``/mcp`` is its first route (a light call is matched once, not
against every sign-in route first), and the paths around it are served as before."""

from __future__ import annotations

import httpx2
from starlette.routing import Route

from app.root.main import build_app
from app.settings import load_settings


async def test_mcp_is_matched_first_and_its_neighbours_are_served_as_before() -> None:
    app = build_app(load_settings(pool_size=1))
    first = app.routes[0]
    assert isinstance(first, Route)
    assert (first.path, first.methods) == ("/mcp", None)  # every method, to the gate
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        # Every method reaches the bearer gate, on /mcp and on /mcp/ (the catch-all).
        for method in ("POST", "GET", "DELETE", "PUT"):
            for path in ("/mcp", "/mcp/"):
                response = await http.request(method, path)
                assert response.status_code == 401, (method, path, response.text)
                assert "resource_metadata=" in response.headers["www-authenticate"]
        assert (await http.get("/nothing-here")).status_code == 404
        assert (await http.get("/.well-known/oauth-protected-resource/mcp")).status_code == 200
