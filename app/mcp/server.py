"""The SDK's MCPServer, with arguments checked the way the rest of our errors read.

Out of the box the SDK answers a bad argument with pydantic's report ("1
validation error for list_sandbox_filesArguments ... visit
https://errors.pydantic.dev/...") and silently ignores a parameter it does not
know, so an agent that misspells ``timeout_s`` as ``timeout`` never learns its
limit was not applied. Here both become ``INVALID_ARGUMENT`` results with the
same shape as every other tool error: a stable code, one sentence per problem
(field names and what is wrong, never the rejected values, which are the
caller's data), and, for an unknown name, the parameters the tool does take.

``tools/list`` lists the schemas trimmed (``schemas.py``): the same results validate,
in about half the characters; the tools whose results can be large declare their
bound to Claude Code.
"""

from __future__ import annotations

import difflib
import uuid
from typing import Any

import structlog
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.types import CallToolResult
from mcp.types import Tool as MCPTool
from mcp_types import SubscriptionsListenRequestParams
from pydantic import ValidationError

from app.mcp.envelope import ToolFailure, error_result
from app.mcp.listen_streams import CappedListenHandler
from app.mcp.runner import Identity
from app.mcp.schemas import declared_meta, trimmed_input_schema, trimmed_output_schema

log = structlog.get_logger(__name__)


class SandboxMCPServer(MCPServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parameters: dict[str, list[str]] | None = None
        self.listen_streams: CappedListenHandler | None = None
        # name -> (the schemas it was trimmed from, the trimmed tool): trimmed once, again
        # only if the tool's schemas are replaced (a tool registered again).
        self._trimmed: dict[str, tuple[tuple[int, int], MCPTool]] = {}

    async def list_tools(self) -> list[MCPTool]:
        return [self._trim(tool) for tool in await super().list_tools()]

    def _trim(self, tool: MCPTool) -> MCPTool:
        source = (id(tool.input_schema), id(tool.output_schema))
        known = self._trimmed.get(tool.name)
        if known is not None and known[0] == source:
            return known[1]
        output = tool.output_schema
        trimmed = tool.model_copy(
            update={
                "input_schema": trimmed_input_schema(tool.input_schema),
                "output_schema": None if output is None else trimmed_output_schema(output),
                "meta": declared_meta(tool.name, tool.meta),
            }
        )
        self._trimmed[tool.name] = (source, trimmed)
        return trimmed

    def cap_listen_streams(self, identity: Identity, *, per_sandbox: int, total: int) -> None:
        """Serve ``subscriptions/listen`` with per-sandbox and server-wide caps."""
        self.listen_streams = CappedListenHandler(
            self._subscriptions, identity, per_sandbox=per_sandbox, total=total
        )
        self._lowlevel_server.add_request_handler(
            "subscriptions/listen", SubscriptionsListenRequestParams, self.listen_streams
        )

    async def _parameters_of(self, name: str) -> list[str] | None:
        # Schemas are read once, and again when a tool appears that was added later.
        if self._parameters is None or name not in self._parameters:
            self._parameters = {
                tool.name: list(tool.input_schema.get("properties", {}))
                for tool in await self.list_tools()
            }
        return self._parameters.get(name)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> Any:
        parameters = await self._parameters_of(name)
        if parameters is not None:
            unknown = [key for key in arguments if key not in parameters]
            if unknown:
                # A body may carry thousands of keys: say what is wrong with a few.
                problems = [_unknown(key, parameters) for key in unknown[:MAX_PROBLEMS]]
                shown = [_short(key) for key in unknown[:MAX_PROBLEMS]]
                return _invalid(name, problems, len(unknown), shown)
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            # A crash whose cause happens to be a ValidationError (a bad result, a model
            # built inside the tool) is the server's fault, not the caller's.
            if isinstance(exc, UnexpectedToolError) or not isinstance(
                exc.__cause__, ValidationError
            ):
                raise
            errors = exc.__cause__.errors()
            problems = [_problem(error) for error in errors[:MAX_PROBLEMS]]
            fields = sorted({_where(e["loc"]) for e in errors})
            return _invalid(name, problems, len(errors), fields)


MAX_PROBLEMS = 10


def _short(text: str, limit: int = 60) -> str:
    """Names come from the caller: never repeat more than a few dozen characters of one."""
    return text if len(text) <= limit else text[:limit] + "..."


def _where(loc: Any) -> str:
    return ".".join(_short(str(part)) for part in loc) or "arguments"


def _unknown(key: str, parameters: list[str]) -> str:
    shown = _short(key)
    close = difflib.get_close_matches(key[:100], parameters, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    takes = ", ".join(parameters) if parameters else "none"
    return f"{shown!r} is not a parameter of this tool{hint}; it takes: {takes}"


def _problem(error: Any) -> str:
    return f"{_where(error['loc'])}: {error['msg']}"


def _invalid(tool: str, problems: list[str], count: int, fields: list[str]) -> CallToolResult:
    log.info("tool.invalid_arguments", tool=tool, count=count, fields=fields[:MAX_PROBLEMS])
    more = count - len(problems)
    message = "; ".join(problems) + (f"; and {more} more" if more > 0 else "")
    failure = ToolFailure("INVALID_ARGUMENT", f"{message}.", {"tool": tool})
    return error_result(failure, uuid.uuid4().hex)
