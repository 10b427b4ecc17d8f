"""The view offered only where asked: to a request whose client declares the MCP Apps
extension (``io.modelcontextprotocol/ui`` with the ``text/html;profile=mcp-app`` MIME
type), and only while ``SANDBOX_MCP_APPS_VIEW`` is on.

For every other request the server reads as if the view did not exist: ``tools/list``
without the app-only tools and without the view's ``_meta`` keys on the tools that name
it, ``resources/list`` without the ``ui://`` resource, the capabilities without the
extension, and a call of an app-only tool or a read of the resource answered exactly
like those of a tool or resource that was never registered.

A 2026-07-28 request declares its client's capabilities itself (``_meta``), so each is
judged alone. The legacy era's requests carry none after ``initialize``, and this
server keeps no MCP session to remember them (``app/mcp/transport.py``): a legacy-era
client never sees the view (nor, in its ``initialize`` answer, the extension: the SDK
sends a legacy client no extensions). claude.ai's connectors speak 2026-07-28.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

from mcp import MCPError
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID, client_supports_apps
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp_types import INVALID_PARAMS

from app.mcp.tools.common import LEGACY_URI_KEY

# A tool name no tool has (names are at most 128 characters of [A-Za-z0-9_.-]): the call
# of a hidden tool is sent on under it, so its answer is the SDK's own for an unknown
# tool, envelope and all; only the name in its sentence is put back.
_NO_SUCH_TOOL = "\x00hidden"
# The methods whose answers the view changes.
_SHAPED = frozenset(
    {
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/read",
        "initialize",
        "server/discover",
    }
)


class ViewGate:
    """Server middleware (``MCPServer.middleware``): see the module's docstring."""

    def __init__(self, *, enabled: bool, app_only_tools: Collection[str]) -> None:
        self._enabled = enabled
        self._app_only = frozenset(app_only_tools)

    def offered(self, ctx: ServerRequestContext[Any, Any]) -> bool:
        return self._enabled and _declares(ctx)

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        method, params = ctx.method, ctx.params if isinstance(ctx.params, dict) else {}
        # Every other message, and the call of any other tool (the hot path), passes as is.
        if ctx.request_id is None or method not in _SHAPED:
            return await call_next(ctx)
        if method == "tools/call" and params.get("name") not in self._app_only:
            return await call_next(ctx)
        if self.offered(ctx):
            return await call_next(ctx)
        if method == "tools/call":
            name = params["name"]
            answer = await call_next(replace(ctx, params={**params, "name": _NO_SUCH_TOOL}))
            return _renamed(answer, name)
        if method == "resources/read" and str(params.get("uri", "")).startswith("ui://"):
            uri = str(params["uri"])
            # What the SDK answers for a URI no resource or template matches.
            raise MCPError(
                code=INVALID_PARAMS, message=f"Unknown resource: {uri}", data={"uri": uri}
            )
        result = await call_next(ctx)
        if not isinstance(result, dict):
            return result
        if method == "tools/list":
            return {
                **result,
                "tools": [_plain(t) for t in result.get("tools", []) if not self._hidden(t)],
            }
        if method == "resources/list":
            kept = [
                r
                for r in result.get("resources", [])
                if not str(r.get("uri", "")).startswith("ui://")
            ]
            return {**result, "resources": kept}
        return _without_extension(result)

    def _hidden(self, tool: dict[str, Any]) -> bool:
        return tool.get("name") in self._app_only


def _declares(ctx: ServerRequestContext[Any, Any]) -> bool:
    if ctx.method == "initialize":
        # The handshake's own capabilities: the session records them only after it.
        params = ctx.params if isinstance(ctx.params, dict) else {}
        capabilities = params.get("capabilities")
        extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
        settings = extensions.get(EXTENSION_ID) if isinstance(extensions, dict) else None
        mime_types = settings.get("mimeTypes") if isinstance(settings, dict) else None
        return isinstance(mime_types, list) and APP_MIME_TYPE in mime_types
    try:
        return client_supports_apps(ctx)
    except AttributeError:  # no session to read (never seen, but never a crash)
        return False


def _plain(tool: dict[str, Any]) -> dict[str, Any]:
    """The tool without the view's ``_meta`` keys (and without ``_meta`` if that was all)."""
    meta = tool.get("_meta")
    if not isinstance(meta, dict) or ("ui" not in meta and LEGACY_URI_KEY not in meta):
        return tool
    rest = {k: v for k, v in meta.items() if k not in ("ui", LEGACY_URI_KEY)}
    plain = {k: v for k, v in tool.items() if k != "_meta"}
    return {**plain, "_meta": rest} if rest else plain


def _renamed(answer: HandlerResult, name: str) -> HandlerResult:
    if not isinstance(answer, dict):
        return answer
    content = [
        {**c, "text": c["text"].replace(_NO_SUCH_TOOL, name)} if c.get("type") == "text" else c
        for c in answer.get("content", [])
    ]
    return {**answer, "content": content}


def _without_extension(result: dict[str, Any]) -> dict[str, Any]:
    """``initialize``'s (and ``server/discover``'s) capabilities without the extension."""
    capabilities = result.get("capabilities")
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    if not isinstance(extensions, dict) or EXTENSION_ID not in extensions:
        return result
    kept = {k: v for k, v in extensions.items() if k != EXTENSION_ID}
    trimmed = {k: v for k, v in capabilities.items() if k != "extensions"}  # type: ignore[union-attr]
    if kept:
        trimmed["extensions"] = kept
    return {**result, "capabilities": trimmed}
