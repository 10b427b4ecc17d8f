"""The Host and Origin values /mcp accepts, from the public URL and the listen address."""

from __future__ import annotations

from app.mcp.allowed_hosts import transport_security


def test_the_public_url_s_host_and_origin_are_accepted() -> None:
    allowed = transport_security("https://mcp.example.com", "0.0.0.0", 8000)
    assert allowed.allowed_hosts == ["mcp.example.com", "mcp.example.com:443"]
    assert allowed.allowed_origins == ["https://mcp.example.com", "https://mcp.example.com:443"]


def test_a_process_on_loopback_accepts_its_own_port_behind_another_public_port() -> None:
    """Several processes behind one loopback public URL each listen on a port of their
    own: each takes the loopback spellings of its own port (the restructure once used
    the public URL's port here, and every process but the first answered 421)."""
    allowed = transport_security("http://127.0.0.1:9000", "127.0.0.1", 9001)
    assert "127.0.0.1:9000" in allowed.allowed_hosts
    for name in ("127.0.0.1", "localhost", "[::1]"):
        assert f"{name}:9001" in allowed.allowed_hosts
        assert f"http://{name}:9001" in allowed.allowed_origins


def test_a_public_host_never_opens_the_loopback_spellings() -> None:
    allowed = transport_security("https://mcp.example.com", "127.0.0.1", 8000)
    assert not any(
        host.startswith(("127.", "localhost", "[::1]")) for host in allowed.allowed_hosts
    )
