"""The MCP Apps view's parts: claude.ai's domain, a file's part of a diff, the byte
bounds of its records, and the gate that hides it from clients that did not ask."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from app.mcp.tools.common import VIEW_TOOL_META, VIEW_URI
from app.mcp.view import snapshot
from app.mcp.view.gate import ViewGate
from app.mcp.view.resource import claude_domain, endpoint_url, page_html
from app.mcp.view.snapshot import ExperimentDetail, ViewExperiment, ViewJob

UI = "io.modelcontextprotocol/ui"
DECLARED = SimpleNamespace(
    extensions={UI: {"mimeTypes": ["text/html;profile=mcp-app"]}}, model_extra=None
)


def test_claudes_domain_is_the_hash_of_the_endpoint_url() -> None:
    url = "https://sandbox.example.com/mcp"
    digest = hashlib.sha256(url.encode()).hexdigest()
    assert claude_domain(url) == f"{digest[:32]}.claudemcpcontent.com"
    assert endpoint_url("https://sandbox.example.com/") == url
    assert endpoint_url("https://sandbox.example.com") == url


def test_the_page_is_one_document_with_nothing_from_elsewhere() -> None:
    html = page_html()
    assert html.startswith("<!doctype html>")
    for forbidden in ("<link", " src=", "http://", "https://", "fetch(", "import "):
        assert forbidden not in html, forbidden
    assert "ui/notifications/initialized" in html


DIFF = (
    "--- a/one.py\n+++ b/one.py\n@@ -1,2 +1,2 @@\n-x = 1\n--- a/two.py\n+x = 2\n"
    "--- /dev/null\n+++ b/new file.txt\n@@ -0,0 +1 @@\n+hello\n"
    "--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
    '--- "a/odd\\nname"\n+++ "b/odd\\nname"\n@@ -1 +1 @@\n-a\n+b\n'
    "[... 3 more changed file(s) not shown: the diff reached its limit of 10 bytes ...]\n"
)


def test_a_files_part_of_the_diff() -> None:
    one = snapshot.file_section(DIFF, "one.py")
    # A removed line that reads like a header ("-- a/two.py") does not end the file.
    assert one == "--- a/one.py\n+++ b/one.py\n@@ -1,2 +1,2 @@\n-x = 1\n--- a/two.py\n+x = 2\n"
    assert snapshot.file_section(
        DIFF,
        "new file.txt",
    ) == ("--- /dev/null\n+++ b/new file.txt\n@@ -0,0 +1 @@\n+hello\n")
    assert (
        snapshot.file_section(DIFF, "gone.txt")
        == "--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
    )
    assert snapshot.file_section(DIFF, "odd\nname") == (
        '--- "a/odd\\nname"\n+++ "b/odd\\nname"\n@@ -1 +1 @@\n-a\n+b\n'
    )
    assert snapshot.file_section(DIFF, "two.py") is None
    assert snapshot.file_section(DIFF, "ne.py") is None
    assert snapshot.file_section("", "one.py") is None


def detail(tail: str, jobs: int = 10) -> ExperimentDetail:
    job = ViewJob(job_id="job", command="c", status="failed", exit_code=1, output_tail=tail)
    experiment = ViewExperiment(
        experiment_id="exp",
        name="n",
        state="FAILED",
        image="i",
        network="none",
        created_at=0.0,
        jobs=[job.model_copy() for _ in range(jobs)],
    )
    return ExperimentDetail(experiment=experiment)


def test_a_small_record_is_left_alone() -> None:
    record = detail("ok")
    assert snapshot.bounded(record) is record


@pytest.mark.parametrize("char", ["\U0001f600", "é", '"', "\\", "\x01"])
def test_a_record_is_cut_to_its_bound_in_bytes_as_sent(char: str) -> None:
    record = detail(char * 3 * snapshot.TAIL_CHARS)
    assert snapshot.wire_bytes(record.model_dump(mode="json")) > snapshot.MAX_RECORD_WIRE_BYTES
    cut = snapshot.bounded(record)
    assert snapshot.wire_bytes(cut.model_dump(mode="json")) <= snapshot.MAX_RECORD_WIRE_BYTES
    assert any("cut to fit" in note for note in cut.notes)
    # The same shape: the view reads it as it reads an uncut one.
    ExperimentDetail.model_validate(cut.model_dump(mode="json"))


def test_a_diff_keeps_its_head_within_the_bound() -> None:
    text = "+" + "\U0001f600" * 20_000
    head = snapshot.head_within(text)
    assert text.startswith(head)
    assert snapshot.wire_bytes(head) <= snapshot.MAX_RECORD_WIRE_BYTES
    assert len(head) > 1_000
    assert snapshot.head_within("short") == "short"


# -- the gate -------------------------------------------------------------------------


@dataclass
class FakeContext:
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    request_id: int | None = 1
    session: Any = field(default_factory=lambda: SimpleNamespace(client_capabilities=None))


TOOLS = {
    "tools": [
        {"name": "get_experiment", "_meta": {**VIEW_TOOL_META}},
        {"name": "sandbox_status", "_meta": {**VIEW_TOOL_META, "other": 1}},
        {"name": "view_sandbox", "_meta": {"ui": {"resourceUri": VIEW_URI, "visibility": ["app"]}}},
        {"name": "list_experiments"},
    ]
}


async def through(gate: ViewGate, ctx: FakeContext, answer: Any) -> Any:
    seen: list[FakeContext] = []

    async def call_next(passed: Any) -> Any:
        seen.append(passed)
        return answer(passed) if callable(answer) else answer

    result = await gate(ctx, call_next)  # type: ignore[arg-type]
    return result, seen


async def test_the_gate_hides_the_view_from_a_client_that_did_not_declare_it() -> None:
    gate = ViewGate(enabled=True, app_only_tools=["view_sandbox"])
    listed, _ = await through(gate, FakeContext("tools/list"), TOOLS)
    assert listed["tools"] == [
        {"name": "get_experiment"},
        {"name": "sandbox_status", "_meta": {"other": 1}},
        {"name": "list_experiments"},
    ]
    resources = {"resources": [{"uri": VIEW_URI}, {"uri": "sandbox://experiments"}]}
    listed, _ = await through(gate, FakeContext("resources/list"), resources)
    assert listed == {"resources": [{"uri": "sandbox://experiments"}]}
    discover = {"capabilities": {"extensions": {UI: {}, "other/x": {}}, "tools": {}}}
    found, _ = await through(gate, FakeContext("server/discover"), discover)
    assert found == {"capabilities": {"extensions": {"other/x": {}}, "tools": {}}}

    unknown = {"content": [{"type": "text", "text": "Unknown tool: \x00hidden"}], "isError": True}
    called, seen = await through(
        gate, FakeContext("tools/call", {"name": "view_sandbox", "arguments": {}}), unknown
    )
    assert seen[0].params["name"] != "view_sandbox"  # never reaches the tool
    assert called["content"][0]["text"] == "Unknown tool: view_sandbox"
    with pytest.raises(Exception, match=r"Unknown resource: ui://sandbox-mcp/view\.html"):
        await through(gate, FakeContext("resources/read", {"uri": VIEW_URI}), {})


async def test_the_gate_shows_the_view_to_a_declaring_client_and_to_nobody_when_off() -> None:
    declared = SimpleNamespace(client_capabilities=DECLARED)
    on = ViewGate(enabled=True, app_only_tools=["view_sandbox"])
    listed, _ = await through(on, FakeContext("tools/list", session=declared), TOOLS)
    assert listed == TOOLS
    # The handshake's own capabilities count for the handshake.
    handshake = FakeContext(
        "initialize",
        {"capabilities": {"extensions": {UI: {"mimeTypes": ["text/html;profile=mcp-app"]}}}},
    )
    caps = {"capabilities": {"extensions": {UI: {}}}}
    found, _ = await through(on, handshake, caps)
    assert found == caps

    off = ViewGate(enabled=False, app_only_tools=[])
    listed, _ = await through(off, FakeContext("tools/list", session=declared), TOOLS)
    # Off, the app-only tools are not registered at all; the others lose the view's keys.
    assert listed["tools"][:2] == [
        {"name": "get_experiment"},
        {"name": "sandbox_status", "_meta": {"other": 1}},
    ]
    assert VIEW_URI not in json.dumps(listed["tools"][:2])
