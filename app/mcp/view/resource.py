"""The view's ``ui://`` resource and the ``_meta`` of the tools that name it.

claude.ai's rules for an App (public threads, late 2026), each kept here:

- the ``resources/read`` result carries ``_meta.ui.domain``: the first 32 hex digits of
  the SHA-256 of the full endpoint URL (``/mcp`` included), then
  ``.claudemcpcontent.com``; without it claude.ai reports success and never mounts;
- a CSP is declared on the resource; every script and style is inline in the one
  document (a view importing from a CDN renders blank); no frame domains;
- tools carry the legacy flat key ``_meta["ui/resourceUri"]`` beside ``_meta.ui``.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from mcp.server.apps import ResourceCsp

# Nothing outside the document: no domain to connect to, load from or frame. The
# view reaches the server only through its host (postMessage), never by itself.
VIEW_CSP = ResourceCsp(connect_domains=[], resource_domains=[], frame_domains=[])

_PAGE = Path(__file__).with_name("page.html")


@cache
def page_html() -> str:
    """The view: one HTML document, every script and style inline."""
    return _PAGE.read_text(encoding="utf-8")


def claude_domain(endpoint_url: str) -> str:
    """claude.ai's sandbox origin for this server's views: ``{hash}.claudemcpcontent.com``,
    the hash being the first 32 hex digits of SHA-256 of the endpoint URL as the
    connector was added (the public URL followed by ``/mcp``)."""
    digest = hashlib.sha256(endpoint_url.encode()).hexdigest()[:32]
    return f"{digest}.claudemcpcontent.com"


def endpoint_url(public_url: str) -> str:
    """The ``/mcp`` endpoint under the public URL (a trailing slash is not doubled)."""
    return public_url.rstrip("/") + "/mcp"
