"""Claude's clients as they are today, against the real server over HTTP (issue 25).

- Claude Code sends ``MCP-Protocol-Version: 2025-11-25, 2025-11-25``: the header
  joined with itself. It is answered as if sent once, in both protocol eras.
- ``tools/list`` is loaded into every conversation: what the model reads (names,
  titles, descriptions, input schemas) stays within MODEL_READ_MAX characters and the
  whole listing within LISTING_MAX (it was 25,918 and 90,703: 62,344 of output
  schemas), while every result still validates against its tool's output schema, and
  no output schema has a top-level ``anyOf`` (claude.ai refuses those).
- A result, its text and its structured content together, stays within about 20k
  tokens (``MAX_RESULT_CHARS``) however much a file or a command holds; the tools whose
  results can be large declare that bound as ``_meta["anthropic/maxResultSizeChars"]``,
  so that Claude Code keeps such a result in the conversation rather than writing it
  to a file past its default 50,000 characters.
- claude.ai shows a spinner and no progress messages: a long call's result text says
  where it stands (a command, a test run, setup commands past the synchronous wait; a
  job waited on that still runs).
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import jsonschema
import pytest
from e2e_server import RunningServer, Servers
from mcp_http import LEGACY, MODERN, read_jsonrpc, rpc_request

from app.mcp.fit import MAX_RESULT_CHARS

pytestmark = pytest.mark.e2e

MODEL_READ_MAX = 30_000
LISTING_MAX = 60_000


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> RunningServer:
    return serve_module()


def legacy(method: str, params: dict[str, Any], version_header: str | None = LEGACY) -> Any:
    """A legacy-era (2025-11-25) POST in local mode: no token, the header as given."""
    return {
        "content": json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}),
        "headers": {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            **({"mcp-protocol-version": version_header} if version_header else {}),
        },
    }


def modern(method: str, params: dict[str, Any], version_header: str = MODERN) -> Any:
    request = rpc_request(method, params)
    request["headers"]["mcp-protocol-version"] = version_header
    return request


INITIALIZE = {
    "protocolVersion": LEGACY,
    "capabilities": {},
    "clientInfo": {"name": "claude-code", "version": "2.1"},
}


async def test_a_doubled_version_header_is_answered_as_if_sent_once(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    answers: dict[str, Any] = {}
    for era, request in (
        ("legacy once", legacy("tools/list", {})),
        ("legacy twice", legacy("tools/list", {}, f"{LEGACY}, {LEGACY}")),
        ("modern once", modern("tools/list", {})),
        ("modern twice", modern("tools/list", {}, f"{MODERN}, {MODERN}")),
    ):
        if era.startswith("legacy"):
            init = await http.post(server.mcp_url, **legacy("initialize", INITIALIZE, None))
            assert init.status_code == 200, init.text
        response = await http.post(server.mcp_url, **request)
        assert response.status_code == 200, (era, response.text[:500])
        answers[era] = read_jsonrpc(response)["result"]["tools"]
    assert answers["legacy twice"] == answers["legacy once"]
    assert answers["modern twice"] == answers["modern once"]
    # A call, too, in the legacy era, as Claude Code makes it.
    called = await http.post(
        server.mcp_url,
        **legacy("tools/call", {"name": "sandbox_status", "arguments": {}}, f"{LEGACY}, {LEGACY}"),
    )
    assert called.status_code == 200, called.text[:500]
    assert not read_jsonrpc(called)["result"].get("isError"), called.text[:500]


async def test_a_version_header_with_two_different_versions_is_refused_with_a_sentence(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    for request in (
        legacy("tools/list", {}, f"{LEGACY}, {MODERN}"),
        modern("tools/list", {}, f"{MODERN}, {LEGACY}"),
    ):
        response = await http.post(server.mcp_url, **request)
        assert response.status_code == 400, response.text[:500]
        message = response.json()["error"]["message"]
        assert message.startswith("The MCP-Protocol-Version header carries 2 different versions")


def compact_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


async def listing(http: httpx2.AsyncClient, server: RunningServer, era: str) -> list[Any]:
    if era == LEGACY:
        init = await http.post(server.mcp_url, **legacy("initialize", INITIALIZE, None))
        assert init.status_code == 200, init.text
        response = await http.post(server.mcp_url, **legacy("tools/list", {}))
    else:
        response = await http.post(server.mcp_url, **modern("tools/list", {}))
    assert response.status_code == 200, response.text[:500]
    tools: list[Any] = read_jsonrpc(response)["result"]["tools"]
    return tools


@pytest.mark.parametrize("era", [LEGACY, MODERN])
async def test_the_tool_listing_fits_what_claude_loads_into_every_conversation(
    http: httpx2.AsyncClient, server: RunningServer, era: str
) -> None:
    tools = await listing(http, server, era)
    read = sum(
        compact_size({k: tool.get(k) for k in ("name", "title", "description", "inputSchema")})
        for tool in tools
    )
    whole = compact_size({"tools": tools})
    outputs = sum(compact_size(tool.get("outputSchema")) for tool in tools)
    print(
        f"\n{era}: {len(tools)} tools, {whole:,} characters ({read:,} read by the model, "
        f"{outputs:,} of output schemas)"
    )
    assert len(tools) == 20
    assert read <= MODEL_READ_MAX, read
    assert whole <= LISTING_MAX, whole
    for tool in tools:
        schema = tool.get("outputSchema")
        if schema is not None:
            assert schema.get("type") == "object", tool["name"]
            assert "anyOf" not in schema, tool["name"]
            assert "oneOf" not in schema, tool["name"]
            jsonschema.Draft202012Validator.check_schema(schema)


async def test_results_still_validate_against_the_listed_output_schemas(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    """The trimmed schemas still describe the results: a client that validates
    ``structuredContent`` (the TypeScript SDK does) accepts every one of these."""
    schemas = {t["name"]: t.get("outputSchema") for t in await listing(http, server, MODERN)}

    async def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        request = modern("tools/call", {"name": name, "arguments": arguments})
        request["headers"]["mcp-name"] = name
        response = await http.post(server.mcp_url, **request)
        result: dict[str, Any] = read_jsonrpc(response)["result"]
        assert not result.get("isError"), (name, result)
        structured = result["structuredContent"]
        jsonschema.validate(structured, schemas[name], cls=jsonschema.Draft202012Validator)
        return dict(structured)

    exp = (await call("create_experiment", {"files": {"a.py": "print(1)\n"}}))["experiment_id"]
    job = await call("execute_experiment", {"experiment_id": exp, "command": "python3 a.py"})
    checked = [
        ("sandbox_status", {}),
        ("get_experiment", {"experiment_id": exp}),
        ("list_experiments", {}),
        ("get_job_status", {"job_id": job["job_id"]}),
        ("get_job_result", {"job_id": job["job_id"], "offset": 0}),
        ("read_sandbox_file", {"experiment_id": exp, "path": "a.py"}),
        ("list_sandbox_files", {"experiment_id": exp}),
        ("search_sandbox", {"experiment_id": exp, "pattern": "print"}),
        ("inspect_changes", {"experiment_id": exp, "include_diff": True}),
        ("map_project", {"experiment_id": exp}),
        ("destroy_experiment", {"experiment_id": exp}),
    ]
    for name, arguments in checked:
        await call(name, arguments)


LARGE = {
    "read_sandbox_file", "search_sandbox", "list_sandbox_files", "map_project",
    "inspect_changes", "compare_experiments", "get_experiment", "list_experiments",
    "get_job_status", "get_job_result", "execute_experiment", "run_tests",
}  # fmt: skip
# A megabyte of file and two of output, with quotes, backslashes and control characters
# (each takes two or six characters in JSON) and non-ASCII text.
WRITE_BIG = (
    "python3 -c 'import sys\n"
    'line = "quote \\" back \\\\ tab \\t bell \\x07 é ü 你好 " * 4 + "\\n"\n'
    'open("big.txt", "w").write(line * (1_048_576 // len(line)))\n'
    "sys.stdout.write(line * (2_097_152 // len(line)))\n"
    "sys.stderr.write(line * 1000)'"
)


async def called(
    http: httpx2.AsyncClient, server: RunningServer, era: str, name: str, args: dict[str, Any]
) -> dict[str, Any]:
    params = {"name": name, "arguments": args}
    if era == LEGACY:
        request = legacy("tools/call", params)
    else:
        request = modern("tools/call", params)
        request["headers"]["mcp-name"] = name
    response = await http.post(server.mcp_url, **request)
    assert response.status_code == 200, response.text[:500]
    result: dict[str, Any] = read_jsonrpc(response)["result"]
    assert not result.get("isError"), (name, str(result)[:500])
    return result


def result_chars(result: dict[str, Any]) -> int:
    """Characters of a result as a client holds it: its text and its structured content."""
    text = sum(len(c["text"]) for c in result["content"] if c["type"] == "text")
    return text + compact_size(result.get("structuredContent"))


def result_bytes(result: dict[str, Any]) -> int:
    """The same in UTF-8 bytes: about four per token for any text (a CJK character is
    three bytes and about one token, where four ASCII characters are)."""
    text = sum(len(c["text"].encode()) for c in result["content"] if c["type"] == "text")
    structured = result.get("structuredContent")
    return text + len(json.dumps(structured, separators=(",", ":"), ensure_ascii=False).encode())


@pytest.mark.parametrize("era", [LEGACY, MODERN])
async def test_large_results_stay_within_the_bound_their_tools_declare(
    http: httpx2.AsyncClient, server: RunningServer, era: str
) -> None:
    declared = {
        t["name"]: (t.get("_meta") or {}).get("anthropic/maxResultSizeChars")
        for t in await listing(http, server, era)
    }
    assert {name for name, value in declared.items() if value} == LARGE
    assert {declared[name] for name in LARGE} == {MAX_RESULT_CHARS}

    exp = (await called(http, server, era, "create_experiment", {}))["structuredContent"]
    exp_id = exp["experiment_id"]
    ran = await called(
        http, server, era, "execute_experiment", {"experiment_id": exp_id, "command": WRITE_BIG}
    )
    job = ran["structuredContent"]
    assert job["exit_code"] == 0, job
    assert job["stdout_truncated"], "more than the 1 MB the server keeps"
    assert job["stdout_chars"] > 500_000, job["stdout_chars"]
    read = await called(
        http,
        server,
        era,
        "read_sandbox_file",
        {"experiment_id": exp_id, "path": "big.txt", "max_bytes": 1_048_576},
    )
    page = await called(
        http,
        server,
        era,
        "get_job_result",
        {"job_id": job["job_id"], "offset": 0, "max_chars": 20_000},
    )
    diff = await called(
        http, server, era, "inspect_changes", {"experiment_id": exp_id, "include_diff": True}
    )
    for name, result in (
        ("execute_experiment", ran),
        ("read_sandbox_file", read),
        ("get_job_result", page),
        ("inspect_changes", diff),
    ):
        size, in_bytes = result_chars(result), result_bytes(result)
        print(f"\n{era} {name}: {size:,} characters, {in_bytes:,} bytes (text and structured)")
        assert size <= MAX_RESULT_CHARS, (name, size)
        # Non-ASCII text takes more tokens a character: the bound holds in bytes too.
        assert in_bytes <= MAX_RESULT_CHARS, (name, in_bytes)
    # The end of the output survives the cut; the file read says it was cut, and keeps
    # as much of a file of escapes as fits (the cut counted each as one character, and
    # kept none of it).
    assert "你好" in job["stdout"][-200:]
    assert any("cut to fit" in note for note in read["structuredContent"]["notes"])
    assert len(read["structuredContent"]["content"]) > 10_000
    await called(http, server, era, "destroy_experiment", {"experiment_id": exp_id})


@pytest.fixture(scope="module")
def impatient(serve_module: Servers) -> RunningServer:
    """A server whose synchronous wait (``SYNC_WAIT_S``) is 2 s instead of 45."""
    return serve_module(SANDBOX_MCP_SYNC_WAIT_S="2")


def text_of(result: dict[str, Any]) -> str:
    return "\n".join(c["text"] for c in result["content"] if c["type"] == "text")


@pytest.mark.parametrize("era", [LEGACY, MODERN])
async def test_a_long_call_s_text_says_where_it_stands(
    http: httpx2.AsyncClient, impatient: RunningServer, era: str
) -> None:
    created = await called(
        http,
        impatient,
        era,
        "create_experiment",
        {
            "files": {"test_slow.py": "import time\ndef test_slow():\n    time.sleep(30)\n"},
            "setup_commands": ["sleep 30", "echo two", "echo three"],
        },
    )
    text = text_of(created)
    (setup,) = created["structuredContent"]["setup"]
    assert setup["status"] == "running", created
    assert (
        f"Setup command 1 of 3 is still running after 2 s, so it continues in the "
        f"background as job {setup['job_id']}" in text
    ), text
    assert "Setup commands 2 to 3 were not started" in text, text
    exp = created["structuredContent"]["experiment_id"]

    ran = await called(
        http, impatient, era, "execute_experiment", {"experiment_id": exp, "command": "sleep 30"}
    )
    job = ran["structuredContent"]["job_id"]
    assert "still running after 2 s, so it continues in the background" in text_of(ran)
    assert job in text_of(ran)
    tests = await called(
        http, impatient, era, "run_tests", {"experiment_id": exp, "command": "sleep 30"}
    )
    assert "still running after 2 s" in text_of(tests), text_of(tests)
    waited = await called(http, impatient, era, "get_job_result", {"job_id": job, "wait_s": 1})
    assert "Still running; call get_job_result again" in text_of(waited), text_of(waited)
    await called(http, impatient, era, "destroy_experiment", {"experiment_id": exp})
