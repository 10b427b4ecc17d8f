"""The Host and Origin values ``/mcp`` accepts (DNS-rebinding protection), from PUBLIC_URL."""

from __future__ import annotations

from urllib.parse import urlsplit

from mcp.server.transport_security import TransportSecuritySettings

from jail.addresses import is_loopback_host


def transport_security(
    public_url: str, listen_host: str, listen_port: int
) -> TransportSecuritySettings:
    """Who may call ``/mcp``: the public URL's host and origin (``public_url``, checked by
    the settings), and any loopback spelling of the address the server listens on when
    both are loopback (``listen_host``, ``listen_port``: several processes behind one
    public URL each listen on a port of their own)."""
    public = urlsplit(public_url)
    assert public.hostname is not None  # validated by Settings
    default_port = 443 if public.scheme == "https" else 80
    port = public.port or default_port
    host = f"[{public.hostname}]" if ":" in public.hostname else public.hostname
    hosts = {f"{host}:{port}"}
    origins = {f"{public.scheme}://{host}:{port}"}
    if port == default_port:
        hosts.add(host)
        origins.add(f"{public.scheme}://{host}")
    if is_loopback_host(listen_host) and is_loopback_host(public.hostname):
        # Local use: any loopback spelling of this server is the same server.
        for name in ("127.0.0.1", "localhost", "[::1]"):
            hosts.add(f"{name}:{listen_port}")
            origins.add(f"http://{name}:{listen_port}")
    return TransportSecuritySettings(allowed_hosts=sorted(hosts), allowed_origins=sorted(origins))
