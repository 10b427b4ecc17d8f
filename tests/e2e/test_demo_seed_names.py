"""The seed's own demo, spoken in the seed's names only: a client written for the
single-user Sandbox MCP (seed 001) ports a Node library to Node 22, unchanged.

Local mode (the project comes from a host folder), over HTTP on the real server and
real Docker. Every argument name below is one seed 001 took; every result field read
is one it returned. The multi-approach shape too: a baseline plus three candidate
fixes alive at once (the default MAX_EXPERIMENTS holds them), then
compare_experiments with labels.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest
from e2e_server import start_server, stop_server
from legacy_vault import NEW_OPEN, NEW_SEAL, OLD_OPEN, OLD_SEAL
from mcp_http import tool

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).parents[2] / "examples" / "legacy-vault"
NODE = "sandbox-mcp/node:22"

# What the seed's create_experiment took, all of it.
SEED_CREATE: dict[str, Any] = {
    "project_path": str(EXAMPLE),
    "base_image": NODE,
    "network_mode": "none",
    "cpu_limit": 1,
    "memory_limit": "1g",
    "timeout": 120,
    "environment_allowlist": ["VAULT_MODE=strict", "SEED_DEMO_FORWARDED"],
    "mount_strategy": "COPY_TO_SANDBOX",
    "setup_commands": ["node --version"],
}

Call = Callable[..., Awaitable[dict[str, Any]]]


async def rewrite(call: Call, experiment: str, path: str, old: str, new: str) -> None:
    """The seed had no edit tool: read, replace, write the whole file."""
    read = await call("read_sandbox_file", experiment_id=experiment, path=path)
    assert old in read["content"], (path, read)
    written = await call(
        "write_sandbox_file",
        experiment_id=experiment,
        path=path,
        content=read["content"].replace(old, new),
    )
    assert not written["is_error"], written


async def allow_node_22(call: Call, experiment: str) -> None:
    await rewrite(call, experiment, "package.json", '"node": ">=14 <19"', '"node": ">=18"')
    install = await call(
        "execute_experiment",
        experiment_id=experiment,
        command="npm install --no-package-lock",
        timeout=120,
    )
    assert install["exit_code"] == 0, install


async def test_the_seeds_node_demo_in_the_seeds_names(tmp_path: Path) -> None:
    host_copy = {path: path.read_bytes() for path in EXAMPLE.rglob("*") if path.is_file()}
    server = start_server(
        tmp_path / "state",
        SANDBOX_MCP_POOL_SIZE="2",
        SANDBOX_MCP_MAX_CONTAINERS="8",  # a baseline and three candidates: past the spare of 2
        SEED_DEMO_FORWARDED="from-the-server",
    )
    try:
        async with httpx2.AsyncClient(timeout=180) as http:

            async def call(tool_name: str, **arguments: object) -> dict[str, Any]:
                return await tool(http, server, "", tool_name, arguments)

            # The experiment's `timeout` is its commands' default, setup commands included.
            quick = await call(
                "create_experiment",
                objective="does the default timeout hold",
                base_image=NODE,
                timeout=2,
                setup_commands=["sleep 30"],
            )
            assert not quick["is_error"], quick
            assert [job["status"] for job in quick["setup"]] == ["timeout"]
            slept = await call(
                "execute_experiment", experiment_id=quick["experiment_id"], command="sleep 30"
            )
            assert slept["status"] == "timeout", slept
            assert slept["duration_ms"] < 20_000
            await call("destroy_experiment", experiment_id=quick["experiment_id"])

            ids: dict[str, str] = {}
            for label in ("Baseline", "Engines only", "Seal only", "Scrypt fix"):
                created = await call("create_experiment", objective=label, **SEED_CREATE)
                assert not created["is_error"], created
                assert created["status"] == created["state"] == "COMPLETED"  # setup ran
                assert (created["objective"], created["base_image"]) == (label, NODE)
                assert created["network_mode"] == "none"
                assert created["isolation"]["network"] == "none"
                assert created["isolation"]["memory_mb"] == 1024
                assert created["isolation"]["cpus"] == 1
                assert created["isolation"]["command_timeout_s"] == 120
                assert created["setup"][0]["exit_code"] == 0
                assert created["setup"][0]["stdout"].startswith("v22.")
                ids[label] = created["experiment_id"]
            baseline, engines, seal, fixed = ids.values()

            env = await call(
                "execute_experiment",
                experiment_id=baseline,
                command='echo "$VAULT_MODE $SEED_DEMO_FORWARDED"',
                timeout=30,
            )
            assert env["stdout"].strip() == "strict from-the-server", env

            here = await call(
                "execute_experiment",
                experiment_id=baseline,
                command="pwd && ls",
                workdir="test",
                timeout=30,
            )
            assert here["stdout"].split() == ["/workspace/test", "vault.test.js"], here
            escaped = await call(
                "execute_experiment", experiment_id=baseline, command="ls", workdir="../.."
            )
            assert escaped["is_error"]
            assert escaped["error"]["code"] == "INVALID_ARGUMENT"

            # The baseline, as the project stands: Node 22 removed createCipher.
            before = await call("run_tests", experiment_id=baseline, timeout=120)
            summary = before["test_summary"]
            assert (summary["framework"], summary["failed"], summary["passed"]) == ("node", 2, 0)

            for candidate in (engines, seal, fixed):
                await allow_node_22(call, candidate)
            await rewrite(call, seal, "index.js", OLD_SEAL, NEW_SEAL)
            await rewrite(call, fixed, "index.js", OLD_SEAL, NEW_SEAL)
            await rewrite(call, fixed, "index.js", OLD_OPEN, NEW_OPEN)
            results = {}
            for label, candidate in list(ids.items())[1:]:
                ran = await call("run_tests", experiment_id=candidate, timeout=120)
                assert ran["test_summary"]["detected"], ran
                results[label] = (ran["test_summary"]["failed"], ran["test_summary"]["passed"])
            assert results == {"Engines only": (2, 0), "Seal only": (1, 1), "Scrypt fix": (0, 2)}

            changes = await call(
                "inspect_changes", experiment_id=fixed, include_diff=True, max_files_with_diff=1
            )
            assert changes["files_modified"] == ["index.js", "package.json"]
            assert (changes["files_created"], changes["files_deleted"]) == ([], [])
            assert "+  const key = crypto.scryptSync(passphrase, salt, 32);" in changes["diff"]
            assert '"node": ">=18"' not in changes["diff"]  # the second file's diff is left out
            assert "1 more changed file(s) not shown" in changes["diff"]

            # All four alive at once; newest first; and the list says when there is more.
            page = await call("list_experiments", limit=2)
            assert [e["experiment_id"] for e in page["experiments"]] == [fixed, seal]
            assert page["total"] == 5
            assert any("3 more experiment(s)" in note for note in page["notes"])
            failed = await call("list_experiments", status="failed")
            assert {e["experiment_id"] for e in failed["experiments"]} == {baseline, engines, seal}
            assert all(e["status"] == "FAILED" for e in failed["experiments"])
            passed = await call("list_experiments", status="Completed")
            assert [e["objective"] for e in passed["experiments"]] == ["Scrypt fix"]

            labels = {experiment: label for label, experiment in ids.items()}
            comparison = await call(
                "compare_experiments", experiment_ids=list(ids.values()), labels=labels
            )
            assert comparison["recommended"] == fixed
            assert comparison["reason"].startswith(
                "Scrypt fix: fewest failing tests (0 of 2, against 1 for Seal only)"
            ), comparison["reason"]
            shown = {e["experiment_id"]: e["label"] for e in comparison["experiments"]}
            assert shown == labels

            for experiment in ids.values():
                gone = await call("destroy_experiment", experiment_id=experiment)
                assert gone["status"] == "DESTROYED"
            destroyed = await call("list_experiments", status="destroyed", limit=20)
            assert destroyed["total"] == len(destroyed["experiments"]) == 5
            assert all(e["status"] == "DESTROYED" for e in destroyed["experiments"])
    finally:
        stop_server(server)
    after = {path: path.read_bytes() for path in EXAMPLE.rglob("*") if path.is_file()}
    assert after == host_copy, "the host copy of the project was changed"


async def test_seed_options_this_server_does_not_offer_are_refused_with_a_code(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path / "state", SANDBOX_MCP_POOL_SIZE="1")
    try:
        async with httpx2.AsyncClient(timeout=120) as http:

            async def refused(**arguments: object) -> dict[str, Any]:
                answer = await tool(http, server, "", "create_experiment", arguments)
                assert answer["is_error"], answer
                assert "Traceback" not in str(answer)
                return dict(answer["error"])

            # Offered only where the operator runs the proxy (test_restricted_egress_*).
            restricted = await refused(network_mode="restricted")
            assert restricted["code"] == "EGRESS_DISABLED"
            assert "SANDBOX_MCP_EGRESS_PROXY" in restricted["message"]
            enabled = await refused(network_mode="enabled", base_image=NODE)
            assert enabled["code"] == "EGRESS_DISABLED"
            mounted = await refused(
                project_path=str(EXAMPLE), mount_strategy="READ_ONLY_BIND_MOUNT"
            )
            assert mounted["code"] == "NOT_SUPPORTED"
            memory = await refused(memory_limit="a lot")
            assert (memory["code"], memory["field"]) == ("INVALID_ARGUMENT", "memory_limit")
            both = await refused(goal="one thing", objective="another")
            assert both["code"] == "INVALID_ARGUMENT"
            assert "keep one of them" in both["message"]
            unknown = await refused(objectiv="typo")
            assert "did you mean 'objective'?" in unknown["message"]
            # The same value under both names is no conflict.
            same = await tool(
                http,
                server,
                "",
                "create_experiment",
                {"goal": "g", "objective": "g", "image": NODE, "base_image": NODE},
            )
            assert not same["is_error"], same
            assert same["goal"] == same["objective"] == "g"
    finally:
        stop_server(server)
