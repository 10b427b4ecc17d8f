"""Every tool, every parameter, hostile values, over HTTP on the real server and Docker.

The inputs come from each tool's own ``inputSchema`` (tools/list), so a tool added
later is covered without touching this file: for every property, values of the
wrong type, oversized, path escapes, NUL bytes, out-of-range numbers, plus an
unknown property and the required ones missing. ``experiment_id`` is a real live
experiment, so hostile paths reach the jail rather than a NOT_FOUND.

What must hold for every call: an answer (HTTP 200) that is a JSON-RPC error or a
tool result marked ``isError`` with a stable code and a sentence, never a
traceback or a host path; no ``tool.crashed`` event in the server's log; the
server healthy afterwards; and the experiment's files untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer, Servers
from mcp_http import post_rpc, read_jsonrpc, tool

pytestmark = pytest.mark.e2e

HOSTILE_STRINGS = [
    "../../../../etc/passwd",
    "/etc/shadow",
    "a\x00b",
    "x" * 300_000,  # oversized
    "",
    "\u202e\ud7ff",
    "$(touch /tmp/pwned)",
]
HOSTILE_NUMBERS: list[Any] = [-1, 0, 10**18, 1e308, "NaN", True]
REPO = Path(__file__).resolve().parents[2]
# What must never appear in an answer: a traceback, a host path, /etc/passwd's contents.
LEAKS = ("Traceback", 'File "', str(REPO), "site-packages", "sqlalchemy", "state/slots", "root:x:0")


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> RunningServer:
    PWNED.unlink(missing_ok=True)
    return serve_module(
        SANDBOX_MCP_POOL_SIZE="2",
        SANDBOX_MCP_QUEUE_WAIT_S="0",
        SANDBOX_MCP_SYNC_WAIT_S="5",
    )


PWNED = Path("/tmp/pwned")


async def call(
    http: httpx2.AsyncClient, server: RunningServer, name: str, args: Any
) -> dict[str, Any]:
    response = await post_rpc(
        http, server.mcp_url, "tools/call", {"name": name, "arguments": args}, name=name
    )
    assert response.status_code in (200, 400, 413), (
        name,
        response.status_code,
        response.text[:300],
    )
    for leak in LEAKS:
        assert leak not in response.text, (name, leak, response.text[:2000])
    return read_jsonrpc(response) if response.status_code == 200 else {"http": response.status_code}


def variants(schema: dict[str, Any]) -> Iterator[Any]:
    """Hostile values for one property, whatever its declared type."""
    yield {"nested": ["object"]}
    yield [1, "two", None]
    yield None
    yield from HOSTILE_STRINGS
    yield from HOSTILE_NUMBERS
    if schema.get("type") == "array" or "anyOf" in schema:
        yield ["../x"] * 10_000
        yield [{"path": "../../etc/passwd", "content": "x"}]
    if schema.get("type") == "object" or "additionalProperties" in schema:
        yield {"../../escape.txt": "x", "/abs.txt": "y", "ok.txt": "z" * 100}


async def test_every_tool_refuses_hostile_input_with_a_code_and_a_sentence(
    server: RunningServer,
) -> None:
    async with httpx2.AsyncClient(timeout=60) as http:
        created = await tool(
            http, server, "", "create_experiment", {"name": "victim", "files": {"keep.txt": "k"}}
        )
        assert not created["is_error"], created
        experiment = created["experiment_id"]
        listed = await post_rpc(http, server.mcp_url, "tools/list", {})
        tools = read_jsonrpc(listed)["result"]["tools"]
        assert len(tools) >= 15
        calls = refused = 0
        codes: set[str] = set()
        # Eight calls at a time: enough to keep the server busy, few enough to stay polite.
        slots = asyncio.Semaphore(8)

        async def limited(pending: Awaitable[dict[str, Any]]) -> dict[str, Any]:
            async with slots:
                return await pending

        for spec in tools:
            name = spec["name"]
            if name == "destroy_experiment":
                continue  # with a valid id it would do its job; its hostile ids are below
            schema = spec["inputSchema"]
            properties: dict[str, Any] = schema.get("properties", {})
            required: list[str] = schema.get("required", [])
            base = {p: experiment for p in properties if p == "experiment_id"}
            cases: list[Any] = [
                {**base, "no_such_parameter": 1},
                "not an object",
                [],
            ]
            if required:
                cases.append({})
            cases += [
                {**base, prop: value}
                for prop, prop_schema in properties.items()
                for value in variants(prop_schema)
                if prop != "experiment_id" or not isinstance(value, str) or value != experiment
            ]
            answers = await asyncio.gather(*(limited(call(http, server, name, a)) for a in cases))

            for args, answer in zip(cases, answers, strict=True):
                error: dict[str, Any] = {}
                calls += 1
                if "http" in answer or "error" in answer:
                    refused += 1  # not a JSON object at all: refused by the transport
                elif "result" not in answer:
                    raise AssertionError(f"{name}: neither a result nor an error: {answer}")
                elif answer["result"].get("isError"):
                    error = (answer["result"].get("structuredContent") or {}).get("error", {})
                    assert error.get("code"), (name, answer)
                    assert error.get("message"), (name, answer)
                    refused += 1
                    codes.add(error["code"])
                if isinstance(args, dict) and "no_such_parameter" in args:
                    assert error.get("code") == "INVALID_ARGUMENT", (name, answer)
        for bad_id in ("../../etc", "exp_" + "0" * 12, "x" * 10_000, "\x00"):
            answer = await call(http, server, "destroy_experiment", {"experiment_id": bad_id})
            assert "error" in answer or answer["result"].get("isError"), answer

        # Still the same experiment, with the same file, and a healthy server.
        kept = await tool(
            http, server, "", "read_sandbox_file", {"experiment_id": experiment, "path": "keep.txt"}
        )
        assert not kept["is_error"], kept
        assert kept["content"] == "k"
        health = (await http.get(f"{server.base_url}/health")).json()
        assert health["status"] == "ok", health
        # Some hostile-looking values are valid (image null, a huge cpus that is clamped):
        # destroy whatever they created, so no container outlives the test.
        listed = await tool(http, server, "", "list_experiments", {})
        for created_experiment in listed["experiments"]:
            await tool(
                http,
                server,
                "",
                "destroy_experiment",
                {"experiment_id": created_experiment["experiment_id"]},
            )
    log = server.log()
    assert "tool.crashed" not in log, [line for line in log.splitlines() if "tool.crashed" in line]
    assert "Traceback" not in log
    print(f"{calls} hostile calls, {refused} refused, codes {sorted(codes)}")
    assert calls > 300
    # Most values are hostile for every tool; the few accepted are legitimate (a search
    # pattern, a command string, a name), and none of those leaked anything (above).
    assert refused / calls > 0.9
    assert {"INVALID_ARGUMENT", "PATH_OUTSIDE_SANDBOX"} <= codes
    ran_on_host = await asyncio.to_thread(PWNED.exists)
    assert not ran_on_host, "a command ran on the host, not in the container"


@pytest.mark.parametrize(
    "uri",
    [
        "sandbox://experiments/../../etc/passwd",
        "sandbox://experiments/%2e%2e/logs",
        "sandbox://experiments/exp_x/artifacts/../../../etc/shadow",
        "sandbox://experiments/exp_x/artifacts/%00",
        "sandbox://experiments/" + "x" * 10_000,
        "sandbox://experiments/exp_000000000000/logs",
        "file:///etc/passwd",
        "http://169.254.169.254/latest/meta-data",
    ],
)
async def test_hostile_resource_uris_are_json_rpc_errors(server: RunningServer, uri: str) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        response = await post_rpc(http, server.mcp_url, "resources/read", {"uri": uri}, name=uri)
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == -32602, error
    assert isinstance(error["message"], str)
    for leak in LEAKS:
        assert leak not in response.text
    assert "Traceback" not in server.log()
