"""Worked demo 2: a Node 16 library ported to Node 22 in an experiment, host copy untouched.

Local mode (the project comes from a host folder), through the MCP tools over HTTP.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx2
import pytest
from e2e_server import start_server, stop_server
from legacy_vault import NEW_OPEN, NEW_SEAL, OLD_OPEN, OLD_SEAL
from mcp_http import tool

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).parents[2] / "examples" / "legacy-vault"

OLD_CODE = f"{OLD_SEAL}\n\n{OLD_OPEN}"
NEW_CODE = f"{NEW_SEAL}\n\n{NEW_OPEN}"


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        h.update(str(path.relative_to(root)).encode())
        if path.is_file():
            h.update(path.read_bytes())
            h.update(str(path.stat().st_mtime_ns).encode())
    return h.hexdigest()


async def test_port_a_node_16_library_to_node_22(tmp_path: Path) -> None:
    before = digest(EXAMPLE)
    server = start_server(tmp_path / "state", SANDBOX_MCP_POOL_SIZE="2")
    try:
        async with httpx2.AsyncClient(timeout=120) as http:

            async def call(tool_name: str, **arguments: object) -> dict[str, object]:
                return await tool(http, server, "", tool_name, arguments)

            created = await call(
                "create_experiment",
                name="node22",
                goal="run legacy-vault on Node 22",
                image="sandbox-mcp/node:22",
                project_path=str(EXAMPLE),
            )
            assert not created["is_error"], created
            exp = created["experiment_id"]
            install = await call(
                "execute_experiment", experiment_id=exp, command="npm install --no-package-lock"
            )
            assert install["exit_code"] != 0
            assert (
                "notsup" in str(install["stderr"]).lower()
                or "engine" in str(install["stderr"]).lower()
            )

            await call("read_sandbox_file", experiment_id=exp, path="package.json")
            edited = await call(
                "edit_sandbox_file",
                experiment_id=exp,
                path="package.json",
                old_text='"node": ">=14 <19"',
                new_text='"node": ">=18"',
            )
            assert not edited["is_error"], edited
            install = await call(
                "execute_experiment", experiment_id=exp, command="npm install --no-package-lock"
            )
            assert install["exit_code"] == 0, install

            failing = await call("run_tests", experiment_id=exp)
            tests = failing["tests"]
            assert isinstance(tests, dict)
            assert (tests["runner"], tests["failed"], tests["passed"]) == ("node", 2, 0)

            source = await call("read_sandbox_file", experiment_id=exp, path="index.js")
            assert "createCipher(" in str(source["content"])
            fixed = await call(
                "edit_sandbox_file",
                experiment_id=exp,
                path="index.js",
                old_text=OLD_CODE,
                new_text=NEW_CODE,
            )
            assert not fixed["is_error"], fixed

            passing = await call("run_tests", experiment_id=exp)
            tests = passing["tests"]
            assert isinstance(tests, dict)
            assert (tests["failed"], tests["passed"], tests["total"]) == (0, 2, 2)
            assert passing["exit_code"] == 0

            changes = await call("inspect_changes", experiment_id=exp, include_diff=True)
            assert sorted(c["path"] for c in changes["modified"]) == ["index.js", "package.json"]  # type: ignore[union-attr]
            assert changes["created"] == []
            assert changes["deleted"] == []
            assert "+  const cipher = crypto.createCipheriv" in str(changes["diff"])
    finally:
        stop_server(server)
    assert digest(EXAMPLE) == before, "the host copy of the project was changed"
