"""A command that prints a lot gives a result the clients can take, with its end in it.

Claude Code caps a tool result at 25,000 tokens by default (MAX_MCP_OUTPUT_TOKENS) and
claude.ai's connectors at about 150,000 characters; an agent needs the end of a failing
log most. The whole recorded output stays readable, page by page.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer, Servers
from mcp_http import post_rpc, read_jsonrpc, tool
from oauth_browser import new_user
from stated_limits import stated

from app.experiments.evidence.shelf import ARTIFACT_PART_BYTES
from app.experiments.views import MAX_LISTED_COMMAND_CHARS, MAX_LISTED_JOBS
from app.mcp.fit import MAX_RESULT_CHARS
from app.mcp.resources import MAX_LOG_CHARS

pytestmark = pytest.mark.e2e

# Far under both clients' caps, with room for the notes and the rest of the result.
MAX_RESULT_BYTES = 60_000
FIVE_MB = 'python3 -c \'import sys\nfor n in range(500_000): sys.stdout.write(f"line {n:06d}\\n")\nsys.stderr.write("Error: the last thing that went wrong\\n"); sys.exit(3)\''  # noqa: E501


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> RunningServer:
    return serve_module(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="7",  # a sandbox for each of the seven tests
        SANDBOX_MCP_SIGNINS_PER_MINUTE="100",
    )


async def raw_call(
    http: httpx2.AsyncClient, server: RunningServer, token: str, name: str, args: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    response = await post_rpc(
        http,
        server.mcp_url,
        "tools/call",
        {"name": name, "arguments": args},
        token=token,
        name=name,
    )
    assert response.status_code == 200, response.text[:500]
    return len(response.content), read_jsonrpc(response)["result"]


async def test_five_megabytes_of_output_fit_the_window_and_keep_their_end(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    token = await new_user(http, server.base_url)
    exp = (await tool(http, server, token, "create_experiment", {}))["experiment_id"]
    size, result = await raw_call(
        http, server, token, "execute_experiment", {"experiment_id": exp, "command": FIVE_MB}
    )
    assert size < MAX_RESULT_BYTES, size
    job = result["structuredContent"]
    assert job["exit_code"] == 3
    assert job["stdout"].startswith("line 000000\n")
    assert job["stdout"].rstrip().endswith("line 499999")  # the end survives both caps
    assert "Error: the last thing that went wrong" in job["stderr"]
    assert job["stdout_truncated"]  # more than the 1 MB the server keeps
    assert job["stdout_left_out"] > 0
    assert any("offset=N" in note for note in job["notes"])

    # The text is for the model: a summary line, then the output as plain text.
    (text,) = [c["text"] for c in result["content"] if c["type"] == "text"]
    assert not text.lstrip().startswith("{")
    assert f"Job {job['job_id']} failed (exit 3)" in text
    assert "line 499999" in text
    assert "Error: the last thing that went wrong" in text

    # Every recorded character is readable in pages, and the pages join up exactly.
    pages: list[str] = []
    offset = 0
    while True:
        size, result = await raw_call(
            http,
            server,
            token,
            "get_job_result",
            {"job_id": job["job_id"], "offset": offset, "max_chars": 20_000},
        )
        assert size < MAX_RESULT_BYTES * 2, size
        page = result["structuredContent"]["page"]
        assert page["offset"] == offset
        pages.append(page["text"])
        if not page["more"]:
            break
        offset = page["end"]
    whole = "".join(pages)
    assert len(whole) == job["stdout_chars"]
    assert whole.startswith("line 000000\n")
    assert whole.rstrip().endswith("line 499999")
    assert "bytes left out ...]" in whole  # where the server's own 1 MB cap cut it
    assert len(pages) > 10


async def test_every_tool_result_fits_even_when_asked_for_a_lot(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    """Tools asked for everything (a 1 MB read, 2,000 matches, 5,000 entries, a big diff)
    answer within the window and say what was cut."""
    token = await new_user(http, server.base_url)
    exp = (await tool(http, server, token, "create_experiment", {}))["experiment_id"]
    await tool(
        http,
        server,
        token,
        "execute_experiment",
        {
            "experiment_id": exp,
            "command": (
                "python3 -c 'import os\n"
                'open("big.txt","w").write("needle " * 150_000 + "THE END")\n'
                'os.makedirs("many")\n'
                "for n in range(3000):\n"
                '    open(f"many/file-{n:05d}-with-a-long-name.txt","w").write("needle\\n" * 3)\''
            ),
        },
    )
    calls: list[tuple[str, dict[str, Any]]] = [
        ("read_sandbox_file", {"experiment_id": exp, "path": "big.txt", "max_bytes": 1_048_576}),
        ("search_sandbox", {"experiment_id": exp, "pattern": "needle", "max_results": 2000}),
        ("list_sandbox_files", {"experiment_id": exp, "max_entries": 5000}),
        ("inspect_changes", {"experiment_id": exp, "include_diff": True}),
    ]
    for name, args in calls:
        size, result = await raw_call(http, server, token, name, args)
        assert size < MAX_RESULT_BYTES, (name, size)
        assert not result.get("isError"), (name, result)
        notes = result["structuredContent"]["notes"]
        assert any("cut to fit the client's window" in note for note in notes), (name, notes)


async def test_the_logs_resource_keeps_its_newest_jobs_within_its_cap(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    # Every job keeps up to 1 MB of stdout and of stderr, and an experiment runs any
    # number of jobs over its life: the logs resource joined them all in one string.
    token = await new_user(http, server.base_url)
    created = await tool(http, server, token, "create_experiment", {})
    assert not created["is_error"], created
    exp = created["experiment_id"]
    loud = "head -c 1000000 /dev/zero | tr '\\0' a; head -c 1000000 /dev/zero | tr '\\0' b >&2"
    jobs = 4
    for _ in range(jobs):
        ran = await tool(
            http, server, token, "execute_experiment", {"experiment_id": exp, "command": loud}
        )
        assert ran["status"] == "completed", ran
    await tool(
        http, server, token, "execute_experiment", {"experiment_id": exp, "command": "echo last"}
    )
    uri = f"sandbox://experiments/{exp}/logs"
    response = await post_rpc(
        http, server.mcp_url, "resources/read", {"uri": uri}, token=token, name=uri
    )
    body = read_jsonrpc(response)
    assert "result" in body, body
    text = body["result"]["contents"][0]["text"]

    print(f"\nthe logs of {jobs} jobs of 2 MB and one short one: {len(text):,} characters")
    # Within what a tool's result may be (a client reads it into the model's window).
    assert len(text) <= MAX_LOG_CHARS == MAX_RESULT_CHARS, len(text)
    assert re.search(r"\$ echo last\nlast\n\[completed, exit 0\] job_\w+\n$", text), text[-200:]
    # The newest first, as many as fit; the first line counts the ones left out.
    left_out = re.match(r"\[(\d+) earlier jobs not shown: ", text)
    assert left_out, text[:200]
    shown = text.count(f"$ {loud}\n")
    assert int(left_out[1]) + shown == jobs, text[:200]
    assert shown >= 1
    # Each big job as an excerpt of both streams: their heads and tails, and what was
    # left out between them.
    assert text.count("characters left out of this excerpt") == 2 * shown, text[:400]
    assert "aaaa" in text
    assert "bbbb" in text


def record_size(structured: dict[str, Any]) -> int:
    """Bytes of a result's record, as the server measures it (UTF-8 JSON): without the
    envelope it adds afterwards (the notes saying what was cut, the idle expiry)."""
    record = {k: v for k, v in structured.items() if k not in ("notes", "idle_expiry_s")}
    return len(json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode())


async def test_a_result_is_cut_at_the_bound_the_docs_state(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    """The 24,000 bytes of docs/limits.md, over HTTP: a read just under it comes
    whole; a read far over it is cut to it, not far below, and says so."""
    bound = stated("STRUCTURED_BUDGET")  # docs/limits.md, "Any result": 24,000
    token = await new_user(http, server.base_url)
    exp = (await tool(http, server, token, "create_experiment", {}))["experiment_id"]
    under, over = bound - 2_000, bound * 4
    command = f"head -c {under} /dev/zero | tr '\\0' a > under.txt; head -c {over} /dev/zero | tr '\\0' b > over.txt"  # noqa: E501
    made = await tool(
        http, server, token, "execute_experiment", {"experiment_id": exp, "command": command}
    )
    assert made["exit_code"] == 0, made

    read = {"experiment_id": exp, "max_bytes": 1_048_576}
    _, whole = await raw_call(
        http, server, token, "read_sandbox_file", {**read, "path": "under.txt"}
    )
    content = whole["structuredContent"]
    assert content["content"] == "a" * under
    assert not any("cut to fit" in note for note in content["notes"]), content["notes"]

    _, cut = await raw_call(http, server, token, "read_sandbox_file", {**read, "path": "over.txt"})
    content = cut["structuredContent"]
    size = record_size(content)
    assert bound - 1_000 < size <= bound, (size, bound)
    assert any("cut to fit the client's window" in note for note in content["notes"])
    print(f"a {over}-byte read answered with a {size}-byte record (bound {bound})")


async def read_resource(
    http: httpx2.AsyncClient, server: RunningServer, token: str, uri: str
) -> dict[str, Any]:
    response = await post_rpc(
        http, server.mcp_url, "resources/read", {"uri": uri}, token=token, name=uri
    )
    return read_jsonrpc(response)


async def test_an_experiment_view_lists_its_newest_jobs_and_cuts_long_commands(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    # An experiment runs any number of jobs, each command up to 100,000 characters; its
    # view (get_experiment, the experiment resource) listed every one, whole.
    token = await new_user(http, server.base_url)
    exp = (await tool(http, server, token, "create_experiment", {}))["experiment_id"]
    jobs = MAX_LISTED_JOBS + 3
    long = "echo long # " + "x" * 99_000
    for n in range(jobs):
        command = long if n == jobs - 1 else f"echo job {n}"
        ran = await tool(
            http, server, token, "execute_experiment", {"experiment_id": exp, "command": command}
        )
        assert ran["status"] == "completed", ran

    size, result = await raw_call(http, server, token, "get_experiment", {"experiment_id": exp})
    view = result["structuredContent"]
    print(f"\nget_experiment of {jobs} jobs, one of 99 KB: {size:,} bytes")
    assert size < MAX_RESULT_BYTES, size
    assert view["jobs_total"] == jobs
    assert len(view["jobs"]) == MAX_LISTED_JOBS
    assert view["jobs_not_listed"] == jobs - MAX_LISTED_JOBS
    assert view["jobs"][0]["command"] == "echo job 3"  # the newest, oldest first
    newest = view["jobs"][-1]
    assert newest["command"] == long[:MAX_LISTED_COMMAND_CHARS]
    assert newest["command_left_out"] == len(long) - MAX_LISTED_COMMAND_CHARS
    assert any("get_experiment(jobs_skip=" in note for note in view["notes"]), view["notes"]
    assert not any("cut to fit" in note for note in view["notes"])  # bounded before fit

    # Page back: the older ones, with how many newer were skipped.
    _, older = await raw_call(
        http, server, token, "get_experiment", {"experiment_id": exp, "jobs_skip": MAX_LISTED_JOBS}
    )
    page = older["structuredContent"]
    assert [j["command"] for j in page["jobs"]] == ["echo job 0", "echo job 1", "echo job 2"]
    assert page["jobs_not_listed"] == 0

    # The experiment resource is the same view.
    body = await read_resource(http, server, token, f"sandbox://experiments/{exp}")
    listed = json.loads(body["result"]["contents"][0]["text"])
    assert len(listed["jobs"]) == MAX_LISTED_JOBS
    assert listed["jobs_total"] == jobs
    # More of the command is one call away.
    status = await tool(http, server, token, "get_job_status", {"job_id": newest["job_id"]})
    assert len(status["command"]) > MAX_LISTED_COMMAND_CHARS * 2
    assert status["command"].startswith(newest["command"])


async def test_evidence_and_comparisons_list_the_newest_exit_codes_and_count_the_rest(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    # compare_experiments and destroy's findings read every job (commands
    # up to 100,000 characters), and exit_codes grew with the number of jobs.
    token = await new_user(http, server.base_url)
    jobs = MAX_LISTED_JOBS + 3
    long = "echo long # " + "x" * 99_000
    experiments = []
    for _ in range(2):
        exp = (await tool(http, server, token, "create_experiment", {}))["experiment_id"]
        for n in range(jobs):
            command = long if n == jobs - 1 else f"echo job {n}; exit {n % 2}"
            args = {"experiment_id": exp, "command": command}
            ran = await tool(http, server, token, "execute_experiment", args)
            assert ran["exit_code"] == (0 if n == jobs - 1 else n % 2), ran
        experiments.append(exp)
    newest_codes = [0 if n == jobs - 1 else n % 2 for n in range(jobs - MAX_LISTED_JOBS, jobs)]

    def assert_bounded(evidence: dict[str, Any]) -> None:
        assert evidence["exit_codes"] == newest_codes, evidence
        assert evidence["exit_codes_not_listed"] == jobs - MAX_LISTED_JOBS
        assert evidence["jobs_total"] == jobs
        assert evidence["jobs_failed"] == sum(n % 2 for n in range(jobs - 1))  # odd ones
        assert evidence["last_exit_code"] == 0
        assert evidence["duration_s"] > 0

    size, result = await raw_call(
        http, server, token, "compare_experiments", {"experiment_ids": experiments}
    )
    print(f"\ncompare_experiments of two with {jobs} jobs, one of 99 KB: {size:,} bytes")
    assert size < MAX_RESULT_BYTES, size
    compared = result["structuredContent"]["experiments"]
    assert [e["experiment_id"] for e in compared] == experiments
    for evidence in compared:
        assert_bounded(evidence)

    # Destroyed, its findings say the same, and it is compared from them.
    destroyed = await tool(
        http, server, token, "destroy_experiment", {"experiment_id": experiments[0]}
    )
    findings = destroyed["findings"]
    assert findings["commands"] == jobs
    assert findings["last_exit_code"] == 0
    assert findings["failed_commands"] == sum(n % 2 for n in range(jobs - 1))
    assert_bounded(findings["evidence"])
    _, result = await raw_call(
        http, server, token, "compare_experiments", {"experiment_ids": experiments}
    )
    for evidence in result["structuredContent"]["experiments"]:
        assert_bounded(evidence)


async def test_a_large_artifact_is_read_in_parts_and_a_small_one_whole(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    # The SDK base64-encodes and serialises a read on the event loop: a whole 20 MB
    # artifact held it about 200 ms and 75 MB a read.
    token = await new_user(http, server.base_url)
    exp = (await tool(http, server, token, "create_experiment", {}))["experiment_id"]
    big = ARTIFACT_PART_BYTES * 2 + 12_345
    made = await tool(
        http,
        server,
        token,
        "execute_experiment",
        {"experiment_id": exp, "command": f"head -c {big} /dev/urandom > big.bin; echo hi > s.txt"},
    )
    assert made["status"] == "completed", made
    collected = await tool(
        http,
        server,
        token,
        "collect_artifacts",
        {"experiment_id": exp, "patterns": ["*.bin", "*.txt"]},
    )
    by_path = {a["path"]: a for a in collected["artifacts"]}
    large, small = by_path["big.bin"], by_path["s.txt"]
    assert large["parts"] == 3
    assert small["parts"] == 1

    # A small artifact reads whole, as before.
    body = await read_resource(http, server, token, small["uri"])
    assert base64.b64decode(body["result"]["contents"][0]["blob"]) == b"hi\n"

    # A whole read of the large one is refused, naming the parts.
    body = await read_resource(http, server, token, large["uri"])
    assert "error" in body, str(body)[:300]
    message = body["error"]["message"]
    assert f"{large['uri']}/parts/N" in message, message
    assert "from 0 to 2" in message, message

    joined = b""
    for part in range(large["parts"]):
        body = await read_resource(http, server, token, f"{large['uri']}/parts/{part}")
        blob = base64.b64decode(body["result"]["contents"][0]["blob"])
        assert len(blob) <= ARTIFACT_PART_BYTES
        joined += blob
    assert len(joined) == big
    assert hashlib.sha256(joined).hexdigest() == large["sha256"]

    # Past the end, or not a number: told, not a traceback.
    for bad in ("3", "x"):
        body = await read_resource(http, server, token, f"{large['uri']}/parts/{bad}")
        assert "error" in body, body
        assert "part" in body["error"]["message"], body
