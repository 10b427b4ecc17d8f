"""Light tool calls answered in one exchange, without the SDK's response stream.

For every 2026-07-28 ``POST /mcp`` the SDK prepares to stream: a memory stream, a task
group, the handler in a task of its own, a second task that waits for the client to go
away (and cancels the handler then), and, when the handler has answered, the
cancellation of that second task. A cancelled task is kept in a reference cycle with its
traceback's frames and the request's objects (the SDK's ``Connection``, its runner, the
scope): about 60 objects a call that only the cyclic collector frees. For
``sandbox_status`` that machinery was most of the call: in-process, 646 us of CPU a call
with it, 454 without, and the collector's time a quarter of what it was.

The SDK has the one-exchange form built in (``json_response``): the handler runs in the
request's own task and its answer is written as ``application/json``, byte for byte what
the streaming form writes for a call that sends no notification before its answer. What
it does not do is notice the client's going away (the call runs to its end; its answer
is written to nobody), nor send notifications (dropped), nor keep an idle proxy awake
with pings. So it serves only the tools declared light (``@tool(light=True)``): they
answer from what the server holds, never wait for a slot, a container or a tenant, and
send no progress. Every other request keeps the streaming form.

Which tool a request calls is read from its ``Mcp-Method`` and ``Mcp-Name`` headers
(2026-07-28 sends both; the transport has already labelled a body sent under another
era's header). The SDK refuses a request whose headers disagree with its body
(``HEADER_MISMATCH``), so a request that claims a light tool and calls another is
refused, not served here.

The SDK exposes the form only as its session manager's setting, for all requests alike;
this module calls the SDK's own 2026-07-28 handler with it, with what the manager holds
(its server, its security settings, its lifespan state). That couples it to the SDK's
``_streamable_http_modern.handle_modern_request``: ``tests/unit/mcp/test_light_calls.py``
checks the coupling, and any request it cannot serve this way (the manager not running,
another SDK shape) takes the streaming path, as before.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from mcp.server import _streamable_http_modern as modern
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.shared.inbound import MCP_METHOD_HEADER, MCP_NAME_HEADER, MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Receive, Scope, Send

_VERSION = MCP_PROTOCOL_VERSION_HEADER.lower().encode("latin-1")
_METHOD = MCP_METHOD_HEADER.lower().encode("latin-1")
_NAME = MCP_NAME_HEADER.lower().encode("latin-1")
_MODERN = frozenset(v.encode("latin-1") for v in MODERN_PROTOCOL_VERSIONS)
_TOOLS_CALL = b"tools/call"


class LightCalls:
    """Serves the calls of ``tools`` in one exchange, for the SDK endpoint ``endpoint``."""

    def __init__(self, endpoint: ASGIApp, tools: Collection[str]) -> None:
        self._manager = (
            endpoint.session_manager if isinstance(endpoint, StreamableHTTPASGIApp) else None
        )
        self._tools = frozenset(name.encode("latin-1") for name in tools if name.isascii())

    def takes(self, scope: Scope, body_size: int) -> bool:
        """Whether this request (its body read to the end, ``body_size`` bytes) is a
        2026-07-28 call of a light tool that this module can serve."""
        manager = self._manager
        if not self._tools or manager is None or manager._task_group is None:
            return False  # (a manager not running: the SDK's own path says so)
        if body_size > manager.max_request_body_size:
            return False  # the SDK's path answers 413
        version = method = name = None
        for key, value in scope["headers"]:
            if key == _VERSION:
                if version is not None:
                    return False  # twice: the SDK's path refuses it
                version = value
            elif key == _METHOD:
                method = value
            elif key == _NAME:
                name = value
        return version in _MODERN and method == _TOOLS_CALL and name in self._tools

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        manager: Any = self._manager
        await modern.handle_modern_request(
            manager.app,
            manager.security_settings,
            True,  # json_response: the handler in this task, its answer as application/json
            manager._lifespan_state,
            scope,
            receive,
            send,
        )
