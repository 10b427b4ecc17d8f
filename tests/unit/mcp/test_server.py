"""SandboxMCPServer: bad arguments are INVALID_ARGUMENT results, unknown names are refused."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from mcp.server.mcpserver.exceptions import UnexpectedToolError
from pydantic import BaseModel, Field

from app.mcp.server import SandboxMCPServer


@pytest.fixture
def server() -> SandboxMCPServer:
    mcp = SandboxMCPServer("test")

    class Shape(BaseModel):
        size: int

    @mcp.tool()
    async def broken() -> str:
        # A bug: a model built inside the tool fails validation. Not the caller's fault.
        return str(Shape.model_validate({"size": "big"}))

    @mcp.tool()
    async def run_command(
        command: Annotated[str, Field(max_length=10)],
        timeout_s: Annotated[float, Field(gt=0)] = 60,
        files: dict[str, str] | None = None,
    ) -> str:
        return f"ran {command} for {timeout_s}"

    return mcp


def error_of(result: Any) -> dict[str, Any]:
    assert result.is_error
    assert result.structured_content is not None
    error: dict[str, Any] = result.structured_content["error"]
    assert result.content[0].text.startswith(f"{error['code']}: {error['message']}")
    return error


async def test_a_misspelled_parameter_is_refused_with_a_suggestion(
    server: SandboxMCPServer,
) -> None:
    error = error_of(await server.call_tool("run_command", {"command": "ls", "timeout": 5}))
    assert error["code"] == "INVALID_ARGUMENT"
    assert (
        "'timeout' is not a parameter of this tool (did you mean 'timeout_s'?)" in error["message"]
    )
    assert "it takes: command, timeout_s, files" in error["message"]


async def test_validation_errors_name_the_field_and_never_echo_the_value(
    server: SandboxMCPServer,
) -> None:
    secret = "sk-live-" + "x" * 40
    error = error_of(await server.call_tool("run_command", {"command": secret, "timeout_s": -1}))
    assert error["code"] == "INVALID_ARGUMENT"
    assert "command: String should have at most 10 characters" in error["message"]
    assert "timeout_s: Input should be greater than 0" in error["message"]
    assert secret not in str(error)
    assert "pydantic.dev" not in str(error)
    nested = error_of(await server.call_tool("run_command", {"command": "ls", "files": {"a": 1}}))
    assert "files.a: Input should be a valid string" in nested["message"]
    missing = error_of(await server.call_tool("run_command", {}))
    assert missing["message"] == "command: Field required."


async def test_good_arguments_still_reach_the_tool(server: SandboxMCPServer) -> None:
    result = await server.call_tool("run_command", {"command": "ls", "timeout_s": 2})
    assert not result.is_error
    assert "ran ls for 2.0" in result.content[0].text


async def test_thousands_of_unknown_keys_get_a_bounded_answer(server: SandboxMCPServer) -> None:
    arguments: dict[str, Any] = {f"k{i}": i for i in range(50_000)}
    arguments["command"] = "ls"
    error = error_of(await server.call_tool("run_command", arguments))
    assert error["message"].endswith("; and 49990 more.")
    assert len(error["message"]) < 2_000


async def test_a_long_name_is_shortened_in_the_answer(server: SandboxMCPServer) -> None:
    long_key = "z" * 300_000
    error = error_of(await server.call_tool("run_command", {"command": "ls", long_key: 1}))
    assert long_key not in error["message"]
    assert len(error["message"]) < 500
    nested = error_of(
        await server.call_tool("run_command", {"command": "ls", "files": {long_key: 1}})
    )
    assert long_key not in nested["message"]


async def test_a_crash_inside_a_tool_is_not_blamed_on_the_caller(
    server: SandboxMCPServer,
) -> None:
    with pytest.raises(UnexpectedToolError):
        await server.call_tool("broken", {})
