"""The Host and Origin values ``/mcp`` accepts (DNS-rebinding protection), from PUBLIC_URL."""

from __future__ import annotations

from urllib.parse import urlsplit

from mcp.server.transport_security import TransportSecuritySettings

from app.settings import ServerSettings, is_loopback_host


def transport_security(server: ServerSettings) -> TransportSecuritySettings:
    public = urlsplit(server.effective_public_url)
    assert public.hostname is not None  # validated by Settings
    default_port = 443 if public.scheme == "https" else 80
    port = public.port or default_port
    host = f"[{public.hostname}]" if ":" in public.hostname else public.hostname
    hosts = {f"{host}:{port}"}
    origins = {f"{public.scheme}://{host}:{port}"}
    if port == default_port:
        hosts.add(host)
        origins.add(f"{public.scheme}://{host}")
    if is_loopback_host(server.host) and is_loopback_host(public.hostname):
        # Local use: any loopback spelling of this server is the same server.
        for name in ("127.0.0.1", "localhost", "[::1]"):
            hosts.add(f"{name}:{server.port}")
            origins.add(f"http://{name}:{server.port}")
    return TransportSecuritySettings(allowed_hosts=sorted(hosts), allowed_origins=sorted(origins))
