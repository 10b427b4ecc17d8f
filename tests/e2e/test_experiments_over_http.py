"""Experiments through the MCP tools over HTTP, on the real Docker daemon .ci/run starts."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import subprocess
import time
from pathlib import Path

import docker
import httpx2
import pytest
from docker.models.containers import Container
from e2e_server import RunningServer, Servers, start_server, stop_server
from mcp_http import job_end, post_rpc, run_command, tool
from oauth_browser import ManualClient

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> RunningServer:
    return serve_module(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="20",
        SANDBOX_MCP_QUEUE_WAIT_S="0",
        SANDBOX_MCP_SIGNINS_PER_MINUTE="100",
        SANDBOX_MCP_SANDBOXES_PER_ADDRESS="1000",  # every test's users sign in from loopback
        SANDBOX_MCP_SYNC_WAIT_S="8",
    )


@pytest.fixture
async def users(http: httpx2.AsyncClient, server: RunningServer) -> tuple[str, str]:
    client = await ManualClient.register(http, server.base_url)
    return await client.access_token(http), await client.access_token(http)


async def test_no_tool_is_docker_shaped(
    http: httpx2.AsyncClient, server: RunningServer, users: tuple[str, str]
) -> None:
    response = await post_rpc(http, server.mcp_url, "tools/list", {}, token=users[0])
    names = {t["name"] for t in response.json()["result"]["tools"]}
    assert {
        "create_experiment",
        "execute_experiment",
        "get_job_status",
        "get_job_result",
        "cancel_job",
        "get_experiment",
        "list_experiments",
        "destroy_experiment",
        "check_sandbox_runtime",
        "read_sandbox_file",
        "write_sandbox_file",
        "edit_sandbox_file",
    } <= names
    assert not [n for n in names if n.startswith("docker_")]
    schemas = str(response.json()["result"]["tools"]).lower()
    for word in ("privileged", "cap_add", "volumes", "docker.sock", "security_opt"):
        assert word not in schemas


async def test_hardened_experiment_lifecycle(
    http: httpx2.AsyncClient, server: RunningServer, users: tuple[str, str]
) -> None:
    alice, _ = users
    created = await tool(
        http,
        server,
        alice,
        "create_experiment",
        {
            "name": "hello",
            "goal": "see that it runs",
            "files": {"hello.py": "print('hello from the sandbox')\n"},
            "setup_commands": ["python3 --version"],
        },
    )
    assert not created["is_error"], created
    exp = created["experiment_id"]
    assert created["state"] == "COMPLETED"  # the setup command ran
    assert created["isolation"]["network"] == "none"
    assert created["idle_expiry_s"] > 0
    ran = await run_command(http, server, alice, exp, "python3 hello.py")
    assert (ran["exit_code"], ran["stdout"]) == (0, "hello from the sandbox\n")
    # The network is really off, the Docker socket is absent, and we are not root.
    probe = await run_command(
        http,
        server,
        alice,
        exp,
        "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), 3)\"; echo net=$?; "
        "test -e /var/run/docker.sock; echo sock=$?; id -u",
    )
    assert "net=1" in probe["stdout"]
    assert "sock=1" in probe["stdout"]
    assert probe["stdout"].strip().endswith("1000")
    failed = await run_command(http, server, alice, exp, "echo oops >&2; exit 3")
    assert (failed["is_error"], failed["status"], failed["exit_code"]) == (False, "failed", 3)
    assert failed["stderr"] == "oops\n"
    view = await tool(http, server, alice, "get_experiment", {"experiment_id": exp})
    assert view["state"] == "FAILED"
    assert [job["command"] for job in view["jobs"]][:1] == ["python3 --version"]
    destroyed = await tool(http, server, alice, "destroy_experiment", {"experiment_id": exp})
    assert destroyed["state"] == "DESTROYED"
    assert destroyed["findings"]["commands"] >= 4
    again = await tool(http, server, alice, "destroy_experiment", {"experiment_id": exp})
    assert again["already_destroyed"] is True
    late = await run_command(http, server, alice, exp, "true")
    assert late["is_error"]
    assert late["error"]["code"] == "INVALID_STATE"


async def sleeps_left(
    http: httpx2.AsyncClient, server: RunningServer, token: str, exp: str, pattern: str
) -> str:
    """How many processes match ``pattern`` in the experiment, once none does or after
    60 s: a killed tree's last processes can still be listed a moment after the
    answer (their exit and reaping take longer on a busy machine)."""
    deadline = time.monotonic() + 60
    while True:
        left = await run_command(
            http, server, token, exp, f"ps -eo args | grep -c '{pattern}' || true"
        )
        count = str(left["stdout"]).strip()
        if count == "0" or time.monotonic() >= deadline:
            return count
        await asyncio.sleep(0.5)


async def test_background_job_timeout_and_cancel_kill_the_whole_tree(
    http: httpx2.AsyncClient, server: RunningServer, users: tuple[str, str]
) -> None:
    alice, _ = users
    exp = (await tool(http, server, alice, "create_experiment", {"name": "tree"}))["experiment_id"]
    # A timeout: the shell, its background children and a grandchild all go.
    timed = await run_command(
        http, server, alice, exp, "sleep 300 & (sleep 301 &) ; sleep 302", timeout_s=2
    )
    assert timed["status"] == "timeout"
    assert await sleeps_left(http, server, alice, exp, "[s]leep 30") == "0"
    # Cancel a background job.
    job = await run_command(http, server, alice, exp, "sleep 400 & sleep 401", background=True)
    assert job["status"] == "running"
    status = await tool(http, server, alice, "get_job_status", {"job_id": job["job_id"]})
    assert status["status"] == "running"
    cancelled = await tool(http, server, alice, "cancel_job", {"job_id": job["job_id"]})
    assert cancelled["status"] == "cancelled"
    assert await sleeps_left(http, server, alice, exp, "[s]leep 40") == "0"
    # A synchronous command past SYNC_WAIT_S (8 s here) returns its job id and goes on.
    slow = await run_command(http, server, alice, exp, "sleep 10; echo done")
    assert slow["status"] == "running"
    assert any("still running" in note for note in slow["notes"])
    result = await job_end(http, server, alice, slow["job_id"])
    assert (result["status"], result["stdout"]) == ("completed", "done\n")
    await tool(http, server, alice, "destroy_experiment", {"experiment_id": exp})


async def test_another_user_cannot_see_run_or_destroy(
    http: httpx2.AsyncClient, server: RunningServer, users: tuple[str, str]
) -> None:
    alice, mallory = users
    exp = (await tool(http, server, alice, "create_experiment", {"name": "private"}))[
        "experiment_id"
    ]
    job = await run_command(http, server, alice, exp, "echo mine")
    answers = [
        await tool(http, server, mallory, "get_experiment", {"experiment_id": exp}),
        await run_command(http, server, mallory, exp, "echo pwned"),
        await tool(http, server, mallory, "destroy_experiment", {"experiment_id": exp}),
        await tool(http, server, mallory, "get_job_result", {"job_id": job["job_id"], "wait_s": 0}),
        await tool(http, server, mallory, "read_sandbox_file", {"experiment_id": exp, "path": "x"}),
        await tool(http, server, mallory, "get_experiment", {"experiment_id": "exp_000000000000"}),
    ]
    assert [a["error"]["code"] for a in answers] == ["NOT_FOUND"] * 6
    assert (await tool(http, server, mallory, "list_experiments"))["experiments"] == []
    still = await tool(http, server, alice, "get_experiment", {"experiment_id": exp})
    assert still["state"] == "COMPLETED"
    await tool(http, server, alice, "destroy_experiment", {"experiment_id": exp})


async def test_limits_are_clamped_and_reported(
    http: httpx2.AsyncClient, server: RunningServer, users: tuple[str, str]
) -> None:
    alice, _ = users
    created = await tool(
        http, server, alice, "create_experiment", {"memory_mb": 999_999, "cpus": 64, "pids": 10**6}
    )
    assert not created["is_error"], created
    warnings = " ".join(created["warnings"])
    assert "memory_mb" in warnings
    assert "cpus" in warnings
    assert "pids" in warnings
    assert created["isolation"]["memory_mb"] == 8192
    ran = await tool(
        http,
        server,
        alice,
        "execute_experiment",
        {"experiment_id": created["experiment_id"], "command": "true", "timeout_s": 10**6},
    )
    assert "timeout_s 1e+06 is above the ceiling; clamped to 1800" in ran["notes"]
    egress = await tool(http, server, alice, "create_experiment", {"network": "egress"})
    assert egress["is_error"]
    await tool(
        http, server, alice, "destroy_experiment", {"experiment_id": created["experiment_id"]}
    )


async def test_orphans_are_swept_at_start_up_and_other_deployments_are_left_alone(
    tmp_path: Path,
) -> None:
    """Another server on the same Docker engine (another deployment) keeps its containers."""
    client = docker.from_env()
    state = tmp_path / "state"
    stop_server(start_server(state, SANDBOX_MCP_POOL_SIZE="2"))
    ours = (state / "deployment-id").read_text().strip()

    def container(deployment: str) -> Container:
        return client.containers.run(
            "sandbox-mcp/base:bookworm",
            "sleep 600",
            detach=True,
            network_mode="none",
            labels={"io.sandbox-mcp.managed": deployment, "io.sandbox-mcp.experiment": "exp_o"},
        )

    orphan, theirs = container(ours), container("another-deployment")
    try:
        stop_server(start_server(state, SANDBOX_MCP_POOL_SIZE="2"))
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(orphan.id)
        assert client.containers.get(theirs.id).status == "running"
    finally:
        for made in (orphan, theirs):
            with contextlib.suppress(docker.errors.NotFound):
                made.remove(force=True)
        client.close()


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
            digest.update(str(path.stat().st_mtime_ns).encode())
    return digest.hexdigest()


async def test_local_mode_leaves_the_host_project_untouched(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "app.py").write_text("print(1)\n")
    (project / ".env").write_text("TOKEN=secret\n")
    before = tree_digest(project)
    server = start_server(tmp_path / "state", SANDBOX_MCP_POOL_SIZE="2")
    try:
        async with httpx2.AsyncClient(timeout=60) as http:
            created = await tool(
                http, server, "", "create_experiment", {"project_path": str(project)}
            )
            assert not created["is_error"], created
            exp = created["experiment_id"]
            assert created["secrets_skipped"] == 1
            rewritten = await run_command(
                http,
                server,
                "",
                exp,
                "ls -a; for f in $(find . -type f); do echo rewritten > $f; done; "
                "rm -rf src; touch new",
            )
            assert ".env" not in rewritten["stdout"]
    finally:
        stop_server(server)
    assert tree_digest(project) == before
    assert os.listdir(project / "src") == ["app.py"]


async def test_git_sources(
    tmp_path: Path, http: httpx2.AsyncClient, server: RunningServer, users: tuple[str, str]
) -> None:
    # Hosted: an https clone needs the operator's SANDBOX_MCP_ALLOW_GIT_EGRESS.
    refused = await tool(
        http,
        server,
        users[0],
        "create_experiment",
        {"git": {"url": "https://example.test/project.git", "ref": "main"}},
    )
    assert refused["is_error"]
    assert refused["error"]["code"] == "GIT_EGRESS_DISABLED"
    # Local mode: a repository on this machine, cloned read-only in a helper container.
    repo = tmp_path / "repo"
    make_repo(repo)
    local = start_server(tmp_path / "state", SANDBOX_MCP_POOL_SIZE="2")
    try:
        created = await tool(
            http, local, "", "create_experiment", {"git": {"url": str(repo), "ref": "v1"}}
        )
        assert not created["is_error"], created
        assert created["source"] == "git"
        ran = await run_command(
            http, local, "", created["experiment_id"], "python3 app.py; git log --oneline | wc -l"
        )
        assert ran["stdout"] == "v1\n1\n"
    finally:
        stop_server(local)


def make_repo(repo: Path) -> None:
    """A small git repository: app.py prints v1 at tag v1 and v2 at HEAD."""
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "app.py").write_text("print('v1')\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], check=True)
    subprocess.run([*git, "tag", "v1"], check=True)
    (repo / "app.py").write_text("print('v2')\n")
    subprocess.run([*git, "commit", "-qam", "v2"], check=True)


async def test_memory_and_process_caps_bite_over_http(
    http: httpx2.AsyncClient, server: RunningServer, users: tuple[str, str]
) -> None:
    alice, _ = users
    runtime = await tool(http, server, alice, "check_sandbox_runtime")
    assert runtime["reachable"] is True
    assert "sandbox-mcp/python:3" in runtime["images"]
    created = await tool(http, server, alice, "create_experiment", {"memory_mb": 256, "pids": 64})
    exp = created["experiment_id"]
    assert (created["isolation"]["memory_mb"], created["isolation"]["pids"]) == (256, 64)
    hog = await run_command(
        http, server, alice, exp, 'python3 -c "b = bytearray(600 * 1024 * 1024)"'
    )
    assert hog["exit_code"] in (137, 1), hog  # OOM-killed, or MemoryError
    forks = await run_command(
        http,
        server,
        alice,
        exp,
        'python3 -c "import os, time\n'
        "n = 0\n"
        "try:\n"
        "    while n < 200:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "        n += 1\n"
        "except OSError:\n"
        "    pass\n"
        "print('forked', n)\"",
        timeout_s=20,
    )
    started = int(forks["stdout"].split()[-1])
    assert started < 64, forks
    await tool(http, server, alice, "destroy_experiment", {"experiment_id": exp})
