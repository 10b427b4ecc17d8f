"""DockerBackend against the real Docker engine that .ci/run starts.

Docker being unreachable, or the sandbox images missing, is a failure here,
never a skip. Every container is labelled with a prefix unique to this run and
removed by the fixtures (and, as a safety net, by the session fixture).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import stat
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from docker_testkit import (
    BACKEND_PREFIX,
    RUN,
    UID,
    backend_on_engine,
    labelled,
    new_workspace,
)
from hardening_checks import assert_hardened
from process_table import PS, parse, split

import app.runtime.exec.kill as runtime_kill
import app.runtime.exec.protocol as fast_exec
from app.runtime.backend import Container, ContainerSpec, ExecResult, Limits
from app.runtime.backends.docker import DockerBackend
from app.runtime.errors import (
    CapacityExceeded,
    ContainerGone,
    EgressDisabled,
    ImageMissing,
    ImageNotAllowed,
    WorkspaceRefused,
)

pytestmark = pytest.mark.integration

IMAGE = "sandbox-mcp/python:3"
MISSING = "sandbox-mcp/never-built:0"
PREFIX = BACKEND_PREFIX
KEEPALIVE = ["/sbin/docker-init -- sleep infinity", "sleep infinity"]
# Marks the processes a test starts, so `ps` output can be searched for them.
TAG = 4242


def _ours(client: docker.DockerClient, prefix: str = PREFIX) -> list[str]:
    return labelled(client, f"{prefix}.managed=1")


@pytest.fixture(params=["docker-exec", "auto"], ids=["docker-exec", "fast"])
async def backend(
    engine: docker.DockerClient, slots: Path, request: pytest.FixtureRequest
) -> AsyncIterator[DockerBackend]:
    """Every test runs on both exec paths: ``docker exec`` per command, and each
    container's executor (app/runtime/exec/protocol.py); on the fast one, every command
    must have gone through the executor."""
    backend = backend_on_engine(
        slots,
        PREFIX,
        (IMAGE, "sandbox-mcp/base:bookworm", MISSING),
        max_containers=100,
        kill_grace_s=20,
        exec_path=request.param,
    )
    yield backend
    await backend.aclose()
    if backend.exec_path == "auto":
        assert backend.exec_runs["docker-exec"] == 0, backend.exec_runs


@dataclass
class Sandbox:
    backend: DockerBackend
    container: Container
    workspace: Path

    @property
    def id(self) -> str:
        return self.container.container_id

    async def run(self, command: str, timeout_s: float = 60, **kwargs: Any) -> ExecResult:
        job_id = kwargs.pop("job_id", f"job-{uuid.uuid4().hex[:8]}")
        return await self.backend.run(
            self.id, command, timeout_s=timeout_s, job_id=job_id, **kwargs
        )

    async def processes(self) -> list[str]:
        """Command lines of every process in the container but this `ps` itself and,
        on the fast path, the executor (exactly one: it runs beside the keep-alive, and
        nothing else of ours does) and the jobs it is starting (process_table)."""
        result = await self.run(PS)
        assert result.exit_code == 0, result
        table = split(parse(result.stdout), fast=self.backend.exec_path == "auto")
        return [p.args for p in table.rest if PS not in p.args]


async def start(
    backend: DockerBackend, slots: Path, limits: Limits | None = None, **kwargs: Any
) -> Sandbox:
    workspace = new_workspace(slots)
    spec = ContainerSpec(
        experiment_id=kwargs.pop("experiment_id", f"exp-{uuid.uuid4().hex[:8]}"),
        sandbox_label=kwargs.pop("sandbox_label", "fp-test"),
        image=kwargs.pop("image", IMAGE),
        workspace=workspace,
        limits=limits or Limits(),
        **kwargs,
    )
    box = Sandbox(backend, await backend.create(spec), workspace)
    # On the fast path the first command must not race the executor's start.
    assert await backend.fast_exec_ready(box.id) == (backend.exec_path == "auto")
    return box


@pytest.fixture
async def sandbox(backend: DockerBackend, slots: Path) -> AsyncIterator[Sandbox]:
    box = await start(backend, slots, Limits(cpus=1, memory_mb=512, pids=128, tmp_mb=64))
    try:
        yield box
    finally:
        await backend.remove(box.id)


def leftovers(processes: list[str]) -> list[str]:
    return [p for p in processes if f"{TAG}" in p]


# -- hardening ---------------------------------------------------------------------------


async def test_the_container_carries_every_hardening_flag(
    sandbox: Sandbox, engine: docker.DockerClient
) -> None:
    attrs = engine.api.inspect_container(sandbox.id)
    host = attrs["HostConfig"]
    assert host["Privileged"] is False  # as the engine reports it, not just omitted
    assert_hardened(host, pids=128, memory_mb=512)
    assert host["Tmpfs"]["/tmp"].startswith("rw,exec,nosuid,nodev,size=64m")
    [mount] = attrs["Mounts"]
    assert mount["Type"] == "bind"
    assert mount["Destination"] == "/workspace"
    assert mount["Source"] == str(sandbox.workspace.resolve())
    assert mount["RW"] is True
    config = attrs["Config"]
    assert config["User"] == "1000:1000"
    assert config["Labels"][f"{PREFIX}.managed"] == "1"
    assert config["Labels"][f"{PREFIX}.sandbox"] == "fp-test"
    assert config["Labels"][f"{PREFIX}.experiment"].startswith("exp-")

    inside = await sandbox.run(
        "grep -E '^(NoNewPrivs|CapEff|CapPrm|CapBnd|Seccomp):' /proc/self/status"
    )
    assert inside.stdout.split() == [
        "CapPrm:",
        "0000000000000000",
        "CapEff:",
        "0000000000000000",
        "CapBnd:",
        "0000000000000000",  # nothing a process could ever raise
        "NoNewPrivs:",
        "1",
        "Seccomp:",
        "2",  # the engine's filter is on
    ]
    tini = await sandbox.run("grep -E '^(CapBnd|Seccomp):' /proc/1/status")
    assert tini.stdout.split() == ["CapBnd:", "0000000000000000", "Seccomp:", "2"]


async def test_a_setuid_root_program_in_the_workspace_runs_as_the_user(
    sandbox: Sandbox,
) -> None:
    # Docker bind mounts take no nosuid flag; no-new-privileges keeps the bit inert.
    planted = sandbox.workspace / "rootshell"
    shutil.copy("/usr/bin/id", planted)
    os.chown(planted, 0, 0)
    os.chmod(planted, 0o4755)
    result = await sandbox.run("./rootshell -u; ./rootshell -ru")
    assert result.stdout.split() == ["1000", "1000"], result


async def test_a_device_node_in_the_workspace_cannot_be_opened(sandbox: Sandbox) -> None:
    # No nodev on the bind either: the engine's device cgroup refuses /dev/mem (1:1)
    # and the raw disk, and without CAP_MKNOD a command cannot make one.
    os.mknod(sandbox.workspace / "mem", 0o666 | stat.S_IFCHR, os.makedev(1, 1))
    result = await sandbox.run("head -c 1 ./mem; echo rc=$?; mknod ./null2 c 1 3; echo rc=$?")
    assert "Operation not permitted" in result.stderr, result
    assert result.stdout.split() == ["rc=1", "rc=1"], result


async def test_developer_tools_work_without_any_capability(slots: Path) -> None:
    node = backend_on_engine(
        slots,
        PREFIX,
        ("sandbox-mcp/node:22",),
        max_containers=100,
    )
    box = await start(node, slots, image="sandbox-mcp/node:22")
    try:
        steps = (
            # git: a repository, a commit, a branch, a checkout
            "git init -q repo && cd repo && git config user.email a@b && git config user.name a"
            " && echo hi > f && git add f && git commit -qm one && git checkout -qb two"
            " && git log --oneline | wc -l && cd ..",
            # npm: a local package packed and installed offline
            "mkdir lib && cd lib && echo "
            + shlex.quote('{"name":"lib","version":"1.0.0","bin":{"hello":"h.js"}}')
            + " > package.json && printf '#!/usr/bin/env node\\nconsole.log(42)\\n' > h.js"
            " && npm pack --silent >/dev/null && cd .."
            " && mkdir app && cd app && npm init -y >/dev/null"
            " && npm install --offline --no-audit --no-fund ../lib/lib-1.0.0.tgz >/dev/null"
            " && npx --offline hello && cd ..",
            # python: a venv in the workspace and a module imported from it
            "python3 -m venv --without-pip venv && echo 'X = 7' > venv/lib/m.py"
            " && PYTHONPATH=venv/lib venv/bin/python -c 'import m; print(m.X)'",
            # file modes, owners that are ours, archives that keep modes
            "touch a && chmod 0600 a && chown 1000:1000 a && cp -p a b && tar cf t.tar a b"
            " && mkdir x && tar xpf t.tar -C x && stat -c %a x/a",
        )
        result = await box.run(" && ".join(steps), timeout_s=120)
        assert result.exit_code == 0, result
        assert result.stdout.split() == ["1", "42", "7", "600"], result
    finally:
        await node.remove(box.id)
        await node.aclose()


async def test_the_network_is_really_off(sandbox: Sandbox) -> None:
    connect = await sandbox.run(
        "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 2)'"
    )
    assert connect.exit_code != 0
    assert "OSError" in connect.stderr or "unreachable" in connect.stderr
    interfaces = await sandbox.run("ls /sys/class/net")
    assert interfaces.stdout.split() == ["lo"]


async def test_the_docker_socket_is_absent(sandbox: Sandbox) -> None:
    result = await sandbox.run(
        "test ! -e /var/run/docker.sock && test ! -e /run/docker.sock && "
        "! grep -q docker.sock /proc/mounts"
    )
    assert result.exit_code == 0, result


async def test_commands_run_as_uid_1000_in_the_workspace(sandbox: Sandbox) -> None:
    result = await sandbox.run("id -u; id -g; pwd; echo $HOME")
    assert result.stdout.split() == ["1000", "1000", "/workspace", "/home/sandbox"]


async def test_workspace_writes_land_in_the_host_folder_and_nothing_else_is_writable(
    sandbox: Sandbox,
) -> None:
    result = await sandbox.run("echo from-container > /workspace/hello.txt")
    assert result.exit_code == 0, result
    written = sandbox.workspace / "hello.txt"
    assert written.read_text() == "from-container\n"
    assert written.stat().st_uid == UID

    root = await sandbox.run("touch /usr/x || touch /x || touch /var/tmp/x")
    assert root.exit_code != 0
    assert "Read-only file system" in root.stderr
    scratch = await sandbox.run("cp /bin/true /tmp/t && /tmp/t && echo ok > ~/.note && cat ~/.note")
    assert scratch.stdout == "ok\n", "/tmp is exec (builds need it) and home is writable"


async def test_the_memory_cap_bites(backend: DockerBackend, slots: Path) -> None:
    box = await start(backend, slots, Limits(memory_mb=128))
    try:
        hog = await box.run(
            "python3 -c 'b = bytearray(512 * 1024 * 1024); b[::4096] = b\"x\" * len(b[::4096])'"
        )
        assert hog.exit_code == 137 or "MemoryError" in hog.stderr, hog
        assert (await box.run("echo alive")).stdout == "alive\n"
    finally:
        await backend.remove(box.id)


async def test_the_pids_cap_bites(backend: DockerBackend, slots: Path) -> None:
    box = await start(backend, slots, Limits(pids=48))
    try:
        forks = await box.run(
            "python3 -c '\n"
            "import os, time\n"
            "n = 0\n"
            "try:\n"
            "    for _ in range(500):\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(60); os._exit(0)\n"
            "        n += 1\n"
            "except OSError as e:\n"
            '    print("failed after", n)\n'
            "'"
        )
        assert forks.exit_code == 0, forks
        words = forks.stdout.split()
        assert words[:2] == ["failed", "after"], forks
        assert int(words[2]) < 48
        assert await box.processes() == KEEPALIVE, "the forked children ended with the command"
    finally:
        await backend.remove(box.id)


# -- the process tree --------------------------------------------------------------------

# Children, grandchildren, a setsid'd grandchild (own session and group), a
# double fork, nohup, and a process that ignores SIGTERM and SIGHUP.
TREE = (
    f"sleep {TAG}1 & "
    f"sh -c 'sleep {TAG}2 & sleep {TAG}3' & "
    f"(setsid sh -c 'sleep {TAG}4 &') ; "
    f"( (sleep {TAG}5 &) & ) ; "
    f"nohup sh -c 'sleep {TAG}6' >/dev/null 2>&1 & "
    f"sh -c \"trap '' TERM HUP; sleep {TAG}7\" & "
    f"echo started; sleep {TAG}0"
)


async def wait_for_tree(box: Sandbox) -> None:
    """Until all eight sleeps of TREE run."""
    for _ in range(300):
        sleeps = {p for p in await box.processes() if p.startswith(f"sleep {TAG}")}
        if len(sleeps) == 8:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the tree never started: {await box.processes()}")


async def test_a_timeout_kills_the_command_and_all_its_descendants(sandbox: Sandbox) -> None:
    running = asyncio.create_task(sandbox.run(TREE, timeout_s=10))
    await wait_for_tree(sandbox)
    result = await asyncio.wait_for(running, 60)
    assert result.timed_out
    assert not result.cancelled
    assert result.exit_code is None
    assert result.stdout == "started\n"
    assert 9.5 < result.duration_s < 60
    assert leftovers(await sandbox.processes()) == []


async def test_cancel_kills_a_running_command_and_all_its_descendants(sandbox: Sandbox) -> None:
    running = asyncio.create_task(sandbox.run(TREE, timeout_s=300, job_id="to-cancel"))
    await wait_for_tree(sandbox)
    assert await sandbox.backend.cancel(sandbox.id, "to-cancel") is True
    result = await asyncio.wait_for(running, 60)
    assert result.cancelled
    assert not result.timed_out
    assert result.exit_code is None
    assert result.stdout == "started\n"
    assert leftovers(await sandbox.processes()) == []
    assert await sandbox.backend.cancel(sandbox.id, "to-cancel") is False


async def test_cancelling_the_caller_also_kills_the_tree(sandbox: Sandbox) -> None:
    running = asyncio.create_task(sandbox.run(TREE, timeout_s=300))
    await wait_for_tree(sandbox)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert leftovers(await sandbox.processes()) == []


async def test_nothing_a_command_started_outlives_it(sandbox: Sandbox) -> None:
    result = await sandbox.run(TREE.replace(f"sleep {TAG}0", "true"))
    assert result.exit_code == 0
    assert not result.timed_out
    assert result.stdout == "started\n"
    assert leftovers(await sandbox.processes()) == []


async def test_kill_0_in_a_script_does_not_orphan_the_rest(sandbox: Sandbox) -> None:
    result = await sandbox.run(f"(setsid sleep {TAG}8 &); sleep {TAG}9 & kill -KILL 0")
    assert result.exit_code == 137
    assert leftovers(await sandbox.processes()) == []


async def test_a_fork_bomb_is_bounded_and_killed(backend: DockerBackend, slots: Path) -> None:
    box = await start(backend, slots, Limits(pids=48))
    try:
        bomb = await box.run(
            "python3 -c 'import os, time\n"
            "while True:\n"
            "    try: os.fork()\n"
            "    except OSError: time.sleep(0.001)'",
            timeout_s=3,
        )
        assert bomb.timed_out, bomb
        # Thousands of killed forks are reaped by the container's init a moment after the
        # kill returns: wait (bounded) for the table to settle, then demand it is clean.
        deadline = asyncio.get_running_loop().time() + 90  # slower on a busy machine
        while (seen := await box.processes()) != KEEPALIVE:
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.5)
        assert seen == KEEPALIVE
    finally:
        await backend.remove(box.id)


async def test_when_the_killer_cannot_run_the_container_is_restarted(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, engine: docker.DockerClient
) -> None:
    monkeypatch.setattr(runtime_kill, "killer_argv", lambda *_: ["/bin/false"])
    if sandbox.backend.exec_path == "auto":
        # An executor that never answers a kill: the kill falls back to docker exec.
        async def silent(*_: object) -> None:
            return None

        monkeypatch.setattr(fast_exec.Session, "kill", silent)
    started_before = engine.api.inspect_container(sandbox.id)["State"]["StartedAt"]
    result = await sandbox.run(f"sleep {TAG}0", timeout_s=2)
    assert result.timed_out
    state = engine.api.inspect_container(sandbox.id)["State"]
    assert state["Running"] is True
    assert state["StartedAt"] != started_before
    # The restart took the executor with it: a new one serves the next commands.
    assert await sandbox.backend.fast_exec_ready(sandbox.id) == (
        sandbox.backend.exec_path == "auto"
    )
    assert leftovers(await sandbox.processes()) == []


# -- results -----------------------------------------------------------------------------


async def test_a_non_zero_exit_is_a_normal_result(sandbox: Sandbox) -> None:
    result = await sandbox.run("echo out; echo err >&2; exit 7")
    assert result.exit_code == 7
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert not result.timed_out
    assert not result.cancelled


async def test_output_is_capped_per_stream_while_read_keeping_both_ends(
    sandbox: Sandbox,
) -> None:
    result = await sandbox.run(
        'python3 -c \'import sys; sys.stdout.write("HEAD" + "x" * 3_000_000 + "TAIL"); '
        'sys.stderr.write("é" * 10)\'',
        max_output_bytes=1_000_000,
    )
    assert result.exit_code == 0
    assert result.stdout.startswith("HEAD")
    assert result.stdout.endswith("TAIL")
    assert "[... 2000008 bytes left out ...]" in result.stdout
    assert result.stdout_truncated
    assert result.stderr == "é" * 10
    assert not result.stderr_truncated


async def test_env_reaches_the_command(sandbox: Sandbox) -> None:
    result = await sandbox.run("echo $GREETING", env={"GREETING": "hi"}, timeout_s=10**6)
    assert result.stdout == "hi\n"


async def test_a_removed_container_is_gone(backend: DockerBackend, slots: Path) -> None:
    box = await start(backend, slots)
    await backend.remove(box.id)
    await backend.remove(box.id)  # idempotent
    with pytest.raises(ContainerGone):
        await box.run("true")


# -- refusals and clamps -----------------------------------------------------------------


async def test_a_workspace_outside_the_slots_base_is_refused(
    backend: DockerBackend, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with pytest.raises(WorkspaceRefused) as caught:
        await backend.create(ContainerSpec("exp-x", "fp", IMAGE, outside))
    assert str(tmp_path) not in caught.value.message


async def test_a_symlinked_workspace_is_refused(backend: DockerBackend, slots: Path) -> None:
    target = new_workspace(slots)
    link = target.parent / "link"
    link.symlink_to(target)
    with pytest.raises(WorkspaceRefused, match="symbolic link"):
        await backend.create(ContainerSpec("exp-x", "fp", IMAGE, link))
    parent_link = slots / f"slot-link-{uuid.uuid4().hex[:8]}"  # once per exec path
    parent_link.symlink_to(target.parent)
    with pytest.raises(WorkspaceRefused, match="symbolic link"):
        await backend.create(ContainerSpec("exp-x", "fp", IMAGE, parent_link / "workspace"))


async def test_images_egress_and_capacity_are_checked(
    backend: DockerBackend, slots: Path, engine: docker.DockerClient
) -> None:
    workspace = new_workspace(slots)
    with pytest.raises(ImageNotAllowed):
        await backend.create(ContainerSpec("e", "fp", "alpine:3", workspace))
    with pytest.raises(ImageMissing):
        await backend.create(ContainerSpec("e", "fp", MISSING, workspace))
    with pytest.raises(EgressDisabled):
        await backend.create(ContainerSpec("e", "fp", IMAGE, workspace, network="egress"))

    prefix = f"io.sandbox-mcp-cap-{RUN}"
    small = backend_on_engine(
        slots,
        prefix,
        (IMAGE,),
        max_containers=1,
    )
    first = await small.create(ContainerSpec("e1", "fp", IMAGE, workspace))
    try:
        with pytest.raises(CapacityExceeded):
            await small.create(ContainerSpec("e2", "fp", IMAGE, new_workspace(slots)))
    finally:
        await small.remove(first.container_id)
        await small.aclose()
    assert _ours(engine, prefix) == []


async def test_limits_above_the_ceilings_are_clamped_with_warnings(
    backend: DockerBackend, slots: Path, engine: docker.DockerClient
) -> None:
    box = await start(backend, slots, Limits(cpus=64, memory_mb=20000, pids=100_000, tmp_mb=1))
    try:
        ncpu = engine.info()["NCPU"]
        cpus = (
            f"cpus 64 is above the {ncpu} CPUs of this host; clamped to {ncpu}"
            if ncpu < 4
            else "cpus 64 is above the ceiling; clamped to 4"
        )
        assert box.container.warnings == (
            cpus,
            "memory_mb 20000 is above the ceiling; clamped to 8192",
            "pids 100000 is above the ceiling; clamped to 2048",
            "tmp_mb 1 is below the minimum; raised to 16",
        )
        host = engine.api.inspect_container(box.id)["HostConfig"]
        assert host["Memory"] == 8192 * 1024 * 1024
        assert host["PidsLimit"] == 2048
        assert host["NanoCpus"] == round(box.container.isolation.cpus * 1e9)
        assert "size=16m" in host["Tmpfs"]["/tmp"]
    finally:
        await backend.remove(box.id)


# -- many at once, orphans, info ---------------------------------------------------------


async def test_orphans_are_swept(
    backend: DockerBackend, slots: Path, engine: docker.DockerClient
) -> None:
    live = await start(backend, slots)
    orphan = await start(backend, slots)
    stranger = engine.api.create_container(
        IMAGE, entrypoint=["true"], labels={"io.sandbox-mcp-someone-else.managed": "1"}
    )["Id"]
    try:
        assert await backend.sweep({live.id}) == 1
        assert _ours(engine) == [live.id]
        engine.api.inspect_container(stranger)  # other labels are not ours to sweep
    finally:
        engine.api.remove_container(stranger, force=True)
        await backend.remove(live.id)
        await backend.remove(orphan.id)


async def test_twenty_sandboxes_run_commands_at_once(backend: DockerBackend, slots: Path) -> None:
    boxes = await asyncio.gather(*(start(backend, slots) for _ in range(20)))
    try:
        results = await asyncio.gather(
            *(
                box.run(f"echo {i} > /workspace/n && python3 -c 'print(sum(range({i})))'")
                for i, box in enumerate(boxes)
            )
        )
        for i, (box, result) in enumerate(zip(boxes, results, strict=True)):
            assert result.exit_code == 0, result
            assert result.stdout == f"{sum(range(i))}\n"
            assert (box.workspace / "n").read_text() == f"{i}\n"
    finally:
        await asyncio.gather(*(backend.remove(box.id) for box in boxes))


async def test_info_reports_the_engine_and_the_images(backend: DockerBackend) -> None:
    info = await backend.info()
    assert info.reachable
    assert info.version
    assert IMAGE in info.images
    assert info.missing_images == (MISSING,)


async def test_host_pids_come_from_the_cgroup_and_match_docker_top(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk budget's list of a container's processes: learnt once (one inspect), then
    read from the container's cgroup, not by the engine running ``ps`` over the host."""
    client = docker.from_env()

    def top() -> set[int]:
        rows = client.api.top(sandbox.id, ps_args="-eo pid")["Processes"]
        return {int(row[0]) for row in rows}

    def refused(*_: object, **__: object) -> None:
        raise AssertionError("docker top was called")

    idle = top()
    running = asyncio.create_task(sandbox.run(f"sleep 60; echo {TAG}"))
    try:
        for _ in range(600):  # 60 s at most for the command to start
            if len(top()) > len(idle):
                break
            await asyncio.sleep(0.1)
        busy = top()
        assert len(busy) > len(idle), busy  # the command's processes are there
        assert set(await sandbox.backend.host_pids(sandbox.id)) == busy
        monkeypatch.setattr(docker.api.client.APIClient, "top", refused)
        # Read again from the cgroup (no engine call), and afresh: the same processes.
        assert set(await sandbox.backend.host_pids(sandbox.id)) == busy
    finally:
        monkeypatch.undo()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    try:
        # The command's tree is gone: a cancelled run's tree is killed as its caller
        # leaves, and the engine may list its last processes a moment longer (seen on
        # a busy machine); then the cgroup read shows it gone as well.
        for _ in range(600):  # 60 s at most
            if top() == idle:
                break
            await asyncio.sleep(0.1)
        assert top() == idle
        assert set(await sandbox.backend.host_pids(sandbox.id)) == idle
    finally:
        client.close()
