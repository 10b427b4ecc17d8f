"""Credential-shaped environment names through create_experiment and execute_experiment,
in both settings of SANDBOX_MCP_STRICT_ENV_DENYLIST (the unit tests call the policy
function; these go through the tools of the real server, into real containers)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx2
import pytest
from e2e_server import RunningServer, Servers
from mcp_http import run_command, tool

pytestmark = pytest.mark.e2e

SECRET = "ghp_not-a-real-token-4711"
CREDENTIAL = f"GITHUB_TOKEN={SECRET}"


@dataclass
class Deployment:
    server: RunningServer
    strict: bool


@pytest.fixture(scope="module", params=[True, False], ids=["strict", "lenient"])
def deployment(request: pytest.FixtureRequest, serve_module: Servers) -> Iterator[Deployment]:
    strict: bool = request.param
    running = serve_module(
        SANDBOX_MCP_POOL_SIZE="1",
        SANDBOX_MCP_STRICT_ENV_DENYLIST=str(strict).lower(),
    )
    yield Deployment(running, strict)
    serve_module.stop(running)


def assert_refused(answer: dict[str, object], name: str) -> None:
    assert answer["is_error"], answer
    error = answer["error"]
    assert isinstance(error, dict)
    assert error["code"] == "ENV_NAME_REFUSED"
    assert name in error["message"]
    assert SECRET not in str(answer), "a value is never echoed"


async def test_create_experiment_with_a_credential_name(
    http: httpx2.AsyncClient, deployment: Deployment
) -> None:
    server = deployment.server
    created = await tool(http, server, "", "create_experiment", {"env": [CREDENTIAL]})
    if deployment.strict:
        assert_refused(created, "GITHUB_TOKEN")
        listed = await tool(http, server, "", "list_experiments", {})
        assert [e for e in listed["experiments"] if e["state"] != "DESTROYED"] == []
        return
    assert not created["is_error"], created
    seen = await run_command(http, server, "", created["experiment_id"], "printenv GITHUB_TOKEN")
    assert seen["stdout"] == f"{SECRET}\n"
    await tool(http, server, "", "destroy_experiment", {"experiment_id": created["experiment_id"]})


async def test_execute_experiment_with_a_credential_name(
    http: httpx2.AsyncClient, deployment: Deployment
) -> None:
    server = deployment.server
    created = await tool(http, server, "", "create_experiment", {})
    experiment = created["experiment_id"]
    try:
        ran = await run_command(
            http, server, "", experiment, "touch ran; printenv GITHUB_TOKEN", env=[CREDENTIAL]
        )
        if deployment.strict:
            assert_refused(ran, "GITHUB_TOKEN")
            probe = await run_command(http, server, "", experiment, "ls")
            assert "ran" not in probe["stdout"].split(), "the refused command never ran"
        else:
            assert (ran["is_error"], ran["stdout"]) == (False, f"{SECRET}\n")
        # The server's own settings never enter a sandbox, in either setting.
        own = await run_command(
            http, server, "", experiment, "true", env=["SANDBOX_MCP_POOL_SIZE=9"]
        )
        assert own["error"]["code"] == "ENV_NAME_REFUSED"
        # A name that is not credential-shaped passes in both.
        plain = await run_command(
            http, server, "", experiment, "printenv GREETING", env=["GREETING=hello"]
        )
        assert plain["stdout"] == "hello\n"
    finally:
        await tool(http, server, "", "destroy_experiment", {"experiment_id": experiment})
