"""DockerBackend.clone against the real Docker engine, from local repositories only.

Every helper here runs with network ``none``: the repositories are made on the
host in tmp_path and cloned through ``local_path``. A remote URL is only ever
refused (egress disabled) before any container starts. Docker being down is a
failure, never a skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import os
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from docker_testkit import (
    GID,
    GIT_PREFIX,
    UID,
    backend_on_engine,
    engine_events,
    labelled,
    new_workspace,
)
from hardening_checks import assert_hardened

import app.runtime.git.clone as runtime_clone
from app.runtime.backend import ContainerSpec, GitSource
from app.runtime.backends.docker import DockerBackend
from app.runtime.errors import (
    CapacityExceeded,
    GitEgressDisabled,
    GitSourceRefused,
    WorkspaceRefused,
)
from app.runtime.git.egress import ensure_network

pytestmark = pytest.mark.integration

IMAGE = "sandbox-mcp/base:bookworm"
PREFIX = GIT_PREFIX
GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def _ours(client: docker.DockerClient, *labels: str) -> list[str]:
    return labelled(client, f"{PREFIX}.managed=1", *labels)


def helpers(client: docker.DockerClient) -> list[str]:
    return _ours(client, f"{PREFIX}.role=git-clone")


def running_helpers(client: docker.DockerClient) -> list[tuple[str, dict[str, Any]]]:
    """The clone helpers that run, and their inspections. One listed and gone before
    its inspection (an earlier test's, its removal finishing: seen on a busy machine)
    is passed over."""
    running = []
    for container_id in helpers(client):
        try:
            attrs = client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            continue
        if attrs["State"]["Running"]:
            running.append((container_id, dict(attrs)))
    return running


def running_helper(client: docker.DockerClient) -> tuple[str, dict[str, Any]] | None:
    """A clone helper that runs, and its inspection (as :func:`running_helpers`)."""
    running = running_helpers(client)
    return running[0] if running else None


@pytest.fixture
async def backend(engine: docker.DockerClient, slots: Path) -> AsyncIterator[DockerBackend]:
    backend = backend_on_engine(
        slots,
        PREFIX,
        ("sandbox-mcp/python:3", IMAGE),
        git_image=IMAGE,
        max_containers=100,
        kill_grace_s=20,
    )
    yield backend
    await backend.aclose()
    assert helpers(engine) == [], "a clone helper outlived its clone"


@pytest.fixture(scope="session", autouse=True)
def git_config(tmp_path_factory: pytest.TempPathFactory) -> None:
    # The clones belong to the sandbox user; git on the host reads them only if told to.
    config = tmp_path_factory.mktemp("git-config") / "gitconfig"
    config.write_text("[safe]\n\tdirectory = *\n")
    GIT_ENV["GIT_CONFIG_GLOBAL"] = str(config)


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


@dataclass(frozen=True)
class Repo:
    path: Path
    bare: Path
    middle: str  # a commit no branch or tag points at


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    """main: v1 (tagged) -> middle -> main; feature branches off v1. f.txt differs per ref."""
    root = tmp_path_factory.mktemp("git-source")
    path = root / "project"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "f.txt").write_text("v1\n")
    (path / "link").symlink_to("f.txt")
    (path / "src").mkdir()
    (path / "src" / "app.py").write_text("print('hi')\n")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "v1")
    git(path, "tag", "v1")
    git(path, "checkout", "-qb", "feature")
    (path / "f.txt").write_text("feature\n")
    git(path, "commit", "-qam", "feature")
    git(path, "checkout", "-q", "main")
    (path / "f.txt").write_text("middle\n")
    git(path, "commit", "-qam", "middle")
    middle = git(path, "rev-parse", "--short=10", "HEAD")
    (path / "f.txt").write_text("main\n")
    git(path, "commit", "-qam", "main")
    bare = root / "project.git"
    git(root, "clone", "-q", "--bare", str(path), str(bare))
    return Repo(path, bare, middle)


def tree_digest(root: Path) -> str:
    """Every path, its type, mode, mtime and content under root (links not followed)."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            full = Path(dirpath) / name
            st = full.lstat()
            digest.update(f"{full.relative_to(root)}\0{st.st_mode}\0{st.st_mtime_ns}\0".encode())
            if full.is_symlink():
                digest.update(os.readlink(full).encode())
            elif full.is_file():
                digest.update(full.read_bytes())
    return digest.hexdigest()


def local(repo_path: Path, ref: str | None = None) -> GitSource:
    return GitSource(url="local", ref=ref, local_path=repo_path)


# -- cloning -----------------------------------------------------------------------------


async def test_the_default_ref_clones_the_working_tree_with_its_history(
    backend: DockerBackend, slots: Path, repo: Repo
) -> None:
    workspace = new_workspace(slots)
    result = await backend.clone(local(repo.path), workspace)
    assert result.exit_code == 0, result
    assert not result.timed_out
    assert (workspace / "f.txt").read_text() == "main\n"
    assert (workspace / "src" / "app.py").read_text() == "print('hi')\n"
    assert os.readlink(workspace / "link") == "f.txt", "links stay links"
    assert (workspace / ".git").is_dir()
    assert not (workspace / ".git" / "shallow").exists(), "a local clone keeps its history"
    assert not (workspace / ".git" / "hooks").exists(), "no template hooks"
    for path in (workspace / "f.txt", workspace / ".git", workspace / ".git" / "HEAD"):
        assert (path.stat().st_uid, path.stat().st_gid) == (UID, GID)
    assert git(workspace, "log", "--format=%s") == "main\nmiddle\nv1"
    config = (workspace / ".git" / "config").read_text()
    assert "hooksPath" not in config, "the clone's safety settings are not left behind"


@pytest.mark.parametrize(
    ("ref", "content"), [("v1", "v1\n"), ("feature", "feature\n"), ("main", "main\n")]
)
async def test_tags_and_branches_give_their_own_content(
    backend: DockerBackend, slots: Path, repo: Repo, ref: str, content: str
) -> None:
    workspace = new_workspace(slots)
    result = await backend.clone(local(repo.path, ref), workspace)
    assert result.exit_code == 0, result
    assert (workspace / "f.txt").read_text() == content


async def test_a_commit_is_checked_out_detached(
    backend: DockerBackend, slots: Path, repo: Repo
) -> None:
    workspace = new_workspace(slots)
    result = await backend.clone(local(repo.path, repo.middle), workspace)
    assert result.exit_code == 0, result
    assert (workspace / "f.txt").read_text() == "middle\n"
    assert git(workspace, "rev-parse", "--short=10", "HEAD") == repo.middle
    assert "as a commit" in result.stderr


async def test_a_bare_repository_clones_too(
    backend: DockerBackend, slots: Path, repo: Repo
) -> None:
    workspace = new_workspace(slots)
    result = await backend.clone(local(repo.bare, "feature"), workspace)
    assert result.exit_code == 0, result
    assert (workspace / "f.txt").read_text() == "feature\n"


async def test_a_bad_ref_is_a_normal_failed_result(
    backend: DockerBackend, slots: Path, repo: Repo
) -> None:
    workspace = new_workspace(slots)
    result = await backend.clone(local(repo.path, "no-such-branch"), workspace)
    assert result.exit_code not in (0, None)
    assert not result.timed_out
    assert "no-such-branch" in result.stderr
    assert workspace.is_dir(), "the workspace is left for the caller to clean"

    commit = await backend.clone(local(repo.path, "0123456789abcdef"), new_workspace(slots))
    assert commit.exit_code not in (0, None), commit


async def test_a_folder_that_is_no_repository_fails_cleanly(
    backend: DockerBackend, slots: Path, tmp_path: Path
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "readme").write_text("not a repo\n")
    result = await backend.clone(local(plain), new_workspace(slots))
    assert result.exit_code not in (0, None)
    assert "repository" in result.stderr


async def test_the_source_is_untouched_and_mounted_read_only(
    backend: DockerBackend,
    slots: Path,
    repo: Repo,
    engine: docker.DockerClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = tree_digest(repo.path)
    result = await backend.clone(local(repo.path, "feature"), new_workspace(slots))
    assert result.exit_code == 0, result
    assert tree_digest(repo.path) == before

    # The same helper, but running a probe instead of git: the mounts, network,
    # user and privileges the clone gets, seen from inside.
    probe = (
        "grep -E ' /(source|workspace) ' /proc/mounts | cut -d' ' -f2,4 | cut -d, -f1 | sort; "
        "touch /source/x 2>/dev/null && echo source-writable; "
        "touch /source/.git/hooks/x 2>/dev/null && echo hooks-writable; "
        "touch /workspace/ok && echo workspace-writable; "
        "ls /sys/class/net; id -u; grep -E '^(CapEff|NoNewPrivs):' /proc/self/status; "
        'echo "$GIT_ALLOW_PROTOCOL $GIT_TERMINAL_PROMPT"'
    )
    monkeypatch.setattr(runtime_clone, "clone_script", lambda plan: probe)
    seen = await backend.clone(local(repo.path), new_workspace(slots))
    assert seen.exit_code == 0, seen
    assert seen.stdout.split("\n") == [
        "/source ro",
        "/workspace rw",
        "workspace-writable",
        "lo",
        "1000",
        "CapEff:\t0000000000000000",
        "NoNewPrivs:\t1",
        "file 0",
        "",
    ]
    assert tree_digest(repo.path) == before


async def test_the_helper_carries_the_hardening_and_is_removed_when_cancelled(
    backend: DockerBackend,
    slots: Path,
    repo: Repo,
    engine: docker.DockerClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime_clone, "clone_script", lambda plan: "sleep 300")
    cloning = asyncio.create_task(backend.clone(local(repo.path), new_workspace(slots)))
    # Running, not just created: the backend counts a helper as its own from the moment
    # its create returns, which can be a little after the engine lists it.
    deadline = time.monotonic() + 90  # a start takes long on a busy machine
    while (found := running_helper(engine)) is None:
        assert time.monotonic() < deadline, "the helper never started"
        await asyncio.sleep(0.05)
    helper, attrs = found
    host = attrs["HostConfig"]
    assert host["Privileged"] is False  # as the engine reports it, not just omitted
    assert_hardened(host, pids=256, memory_mb=1024)
    mounts = {m["Destination"]: m for m in attrs["Mounts"]}
    assert set(mounts) == {"/workspace", "/source"}
    assert mounts["/source"]["RW"] is False
    assert mounts["/source"]["Source"] == str(repo.path.resolve())
    assert mounts["/workspace"]["RW"] is True
    [source_mount] = [m for m in host["Mounts"] if m["Target"] == "/source"]
    assert source_mount["BindOptions"] == {"NonRecursive": True}, "no writable submounts"
    assert attrs["Config"]["User"] == "1000:1000"
    assert attrs["Config"]["Labels"][f"{PREFIX}.role"] == "git-clone"

    assert await backend.sweep(set()) == 0, "a clone in flight is not an orphan"
    assert helper in helpers(engine)

    cloning.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cloning
    assert helpers(engine) == []


async def test_a_timeout_kills_the_clone_and_removes_the_helper(
    backend: DockerBackend,
    slots: Path,
    repo: Repo,
    engine: docker.DockerClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime_clone, "clone_script", lambda plan: "echo started; sleep 300")
    # 5 s, not less: the clock starts with the exec request, and on a loaded machine
    # the engine can take seconds to start the script (it failed so under load here).
    result = await backend.clone(local(repo.path), new_workspace(slots), timeout_s=5)
    assert result.timed_out
    assert result.exit_code is None
    assert result.stdout == "started\n"
    assert 5 <= result.duration_s < 60
    assert helpers(engine) == []


async def test_helpers_are_removed_after_success_and_failure(
    backend: DockerBackend, slots: Path, repo: Repo, engine: docker.DockerClient
) -> None:
    ok = await backend.clone(local(repo.path), new_workspace(slots))
    assert ok.exit_code == 0
    assert helpers(engine) == []
    failed = await backend.clone(local(repo.path, "nope"), new_workspace(slots))
    assert failed.exit_code != 0
    assert helpers(engine) == []


async def test_sweep_removes_a_leftover_helper(
    backend: DockerBackend, engine: docker.DockerClient
) -> None:
    leftover = engine.api.create_container(
        IMAGE,
        entrypoint=["true"],
        labels={f"{PREFIX}.managed": "1", f"{PREFIX}.role": "git-clone"},
        host_config=engine.api.create_host_config(network_mode="none"),
    )["Id"]
    try:
        assert helpers(engine) == [leftover]
        assert await backend.sweep(set()) == 1
        assert helpers(engine) == []
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            engine.api.remove_container(leftover, force=True)


# -- refusals, before any container ------------------------------------------------------


async def test_a_remote_url_without_git_egress_is_refused_before_any_container(
    backend: DockerBackend, slots: Path, engine: docker.DockerClient
) -> None:
    workspace = new_workspace(slots)
    with pytest.raises(GitEgressDisabled) as caught:
        await backend.clone(GitSource("https://example.invalid/owner/repo.git"), workspace)
    assert caught.value.code == "GIT_EGRESS_DISABLED"
    assert "send the project's files" in caught.value.message
    assert _ours(engine) == []
    assert list(workspace.iterdir()) == []


async def test_sources_and_workspaces_that_may_not_be_used_are_refused(
    backend: DockerBackend, slots: Path, repo: Repo, engine: docker.DockerClient
) -> None:
    workspace = new_workspace(slots)
    with pytest.raises(GitSourceRefused, match="inside the sandboxes' storage"):
        await backend.clone(local(new_workspace(slots)), workspace)
    with pytest.raises(GitSourceRefused, match="ref"):
        await backend.clone(local(repo.path, "--upload-pack=touch /x"), workspace)
    (workspace / "already").write_text("here\n")
    with pytest.raises(WorkspaceRefused, match="empty"):
        await backend.clone(local(repo.path), workspace)
    with pytest.raises(WorkspaceRefused, match="outside"):
        await backend.clone(local(repo.path), repo.path.parent)
    assert _ours(engine) == []


async def test_a_clone_helper_counts_against_its_sandbox_share(
    slots: Path, repo: Repo, engine: docker.DockerClient
) -> None:
    # Two slots, two containers: no spare. A sandbox that has its container cannot
    # start a helper too; one that has none can (the helper is its first).
    small = backend_on_engine(
        slots,
        PREFIX,
        (IMAGE,),
        git_image=IMAGE,
        max_containers=2,
        pool_size=2,
    )
    held = await small.create(ContainerSpec("e-a", "fp-a", IMAGE, new_workspace(slots)))
    try:
        with pytest.raises(CapacityExceeded) as caught:
            await small.clone(local(repo.path), new_workspace(slots), sandbox_label="fp-a")
        assert caught.value.details["reason"] == "spare_in_use"
        workspace = new_workspace(slots)
        result = await small.clone(local(repo.path), workspace, sandbox_label="fp-b")
        assert result.exit_code == 0, result
        assert (workspace / "f.txt").read_text() == "main\n"
    finally:
        await small.remove(held.container_id)
        await small.aclose()
    assert helpers(engine) == []


# -- remote egress: public addresses only, pinned, on a network of its own ---------------

REFUSED_REMOTES = [
    "https://169.254.169.254/latest/meta-data/",
    "https://10.0.0.5/o/r.git",
    "https://127.0.0.1/o/r.git",
    "https://2130706433/o/r.git",
    "https://localhost/o/r.git",
    "https://[::ffff:127.0.0.1]/o/r.git",
    "https://metadata.google.internal/computeMetadata/v1/",
    "https://github.com:22/o/r.git",
]


GIT_NETWORK = f"{PREFIX}-git"


def egress_backend_on(slots: Path, **options: Any) -> DockerBackend:
    """A backend whose clone helpers may reach remotes, from their own network."""
    return backend_on_engine(
        slots,
        PREFIX,
        (IMAGE,),
        git_image=IMAGE,
        allow_git_egress=True,
        git_network=GIT_NETWORK,
        **options,
    )


@pytest.fixture
async def egress_backend(engine: docker.DockerClient, slots: Path) -> AsyncIterator[DockerBackend]:
    backend = egress_backend_on(slots)
    yield backend
    await backend.aclose()
    with contextlib.suppress(docker.errors.NotFound):
        engine.api.remove_network(GIT_NETWORK)


@pytest.mark.parametrize("url", REFUSED_REMOTES)
async def test_a_clone_of_a_non_public_address_never_starts_a_container(
    egress_backend: DockerBackend, slots: Path, engine: docker.DockerClient, url: str
) -> None:
    since = f"{time.time():.9f}"  # the engine takes fractions: earlier tests' events stay out
    workspace = new_workspace(slots)
    with pytest.raises(GitSourceRefused) as caught:
        await egress_backend.clone(GitSource(url), workspace)
    assert caught.value.details["field"] == "url"
    events = engine_events(
        engine,
        since=since,
        until=int(time.time()) + 1,
        filters={"type": "container", "event": "create", "label": f"{PREFIX}.managed=1"},
    )
    assert events == [], "no helper was even created"
    assert list(workspace.iterdir()) == []


async def test_a_remote_clone_connects_only_to_the_pinned_address_from_its_own_network(
    egress_backend: DockerBackend, slots: Path, engine: docker.DockerClient
) -> None:
    # No internet here: a name that resolves nowhere is "resolved" to a listener on
    # the helpers' network gateway (allowed for this test only). That git reaches it
    # at all proves the pin: the helper's own DNS knows no such name.
    ensure_network(engine.api, GIT_NETWORK, {f"{PREFIX}.managed": "git"})
    [config] = engine.api.inspect_network(GIT_NETWORK)["IPAM"]["Config"]
    gateway = config["Gateway"]
    seen: list[tuple[str, str]] = []  # (peer address, the helper's network mode)

    def listen(server: socket.socket) -> None:
        conn, peer = server.accept()
        with conn:
            # The helper connecting runs; an earlier test's, listed and gone before its
            # inspection (its removal finishing on a busy machine), is passed over.
            [(_, attrs)] = running_helpers(engine)  # the one whose git connects
            seen.append((peer[0], attrs["HostConfig"]["NetworkMode"]))
            conn.recv(1024)  # the TLS ClientHello; closing fails the handshake

    async def resolve(host: str, port: int) -> list[str]:
        assert (host, port) == ("git.pinned.invalid", 443)
        return [gateway]

    backend = egress_backend_on(
        slots,
        resolve=resolve,
        git_address_policy=lambda address: str(address) == gateway,
    )
    since = f"{time.time():.9f}"
    with socket.create_server((gateway, 443)) as server:
        server.settimeout(60)
        listener = threading.Thread(target=listen, args=(server,), daemon=True)
        listener.start()
        try:
            result = await backend.clone(
                GitSource("https://git.pinned.invalid/o/r.git"), new_workspace(slots)
            )
        finally:
            await backend.aclose()
        listener.join(10)
    assert len(seen) == 1, "git never connected to the pinned address"
    created = engine_events(
        engine,
        since=since,
        until=int(time.time()) + 1,
        filters={"type": "container", "event": "create", "label": f"{PREFIX}.managed=1"},
    )
    assert len(created) == 1, "the event query the refusal test relies on sees helpers"
    peer, mode = seen[0]
    assert mode == GIT_NETWORK, "a network of its own, not the default bridge"
    assert ipaddress.ip_address(peer) in ipaddress.ip_network(config["Subnet"])
    options = engine.api.inspect_network(GIT_NETWORK)["Options"]
    assert options["com.docker.network.bridge.enable_icc"] == "false"
    assert result.exit_code != 0
    # git's lines name the address and the TLS failure; the tenant gets one sentence.
    assert gateway not in result.stderr
    assert result.stderr in (
        "the TLS connection to the server failed",
        "the server could not be reached over https, or the clone failed",
    )
