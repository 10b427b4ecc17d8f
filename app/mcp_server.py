"""The SDK's MCPServer, with arguments checked the way the rest of our errors read.

Out of the box the SDK answers a bad argument with pydantic's report ("1
validation error for list_sandbox_filesArguments ... visit
https://errors.pydantic.dev/...") and silently ignores a parameter it does not
know, so an agent that misspells ``timeout_s`` as ``timeout`` never learns its
limit was not applied. Here both become ``INVALID_ARGUMENT`` results with the
same shape as every other tool error: a stable code, one sentence per problem
(field names and what is wrong, never the rejected values, which are the
caller's data), and, for an unknown name, the parameters the tool does take.
"""

from __future__ import annotations

import difflib
import uuid
from typing import Any

import structlog
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult
from pydantic import ValidationError

from app.calls import ToolFailure, error_result

log = structlog.get_logger(__name__)


class SandboxMCPServer(MCPServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parameters: dict[str, list[str]] | None = None

    async def _parameters_of(self, name: str) -> list[str] | None:
        # Tools are all registered before the first call; read their schemas once.
        if self._parameters is None:
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
                return _invalid(name, [_unknown(key, parameters) for key in unknown], unknown)
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            problems = [_problem(error) for error in exc.__cause__.errors()]
            fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.__cause__.errors()})
            return _invalid(name, problems, fields)


def _unknown(key: str, parameters: list[str]) -> str:
    shown = key if len(key) <= 60 else key[:60] + "..."
    close = difflib.get_close_matches(key, parameters, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    takes = ", ".join(parameters) if parameters else "none"
    return f"{shown!r} is not a parameter of this tool{hint}; it takes: {takes}"


def _problem(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "arguments"
    return f"{where}: {error['msg']}"


def _invalid(tool: str, problems: list[str], fields: list[str]) -> CallToolResult:
    log.info("tool.invalid_arguments", tool=tool, fields=fields[:20])
    message = "; ".join(problems[:10]) + ("; ..." if len(problems) > 10 else "")
    failure = ToolFailure("INVALID_ARGUMENT", f"{message}.", {"tool": tool})
    return error_result(failure, uuid.uuid4().hex)
