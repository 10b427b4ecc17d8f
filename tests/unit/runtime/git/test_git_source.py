"""Git sources without a daemon: which URLs, refs and local paths are refused, the
script the helper runs (executed against a fake ``git``), and the helper's spec.

The real helper is exercised in tests/integration/runtime/test_docker_git.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import docker
import pytest
from dns_testkit import SlowNameserver
from docker.types import HostConfig
from hardening_checks import assert_hardened

from app.errors import ConfigurationError
from app.runtime.backend import ExecResult, GitSource
from app.runtime.backends.docker import DockerBackend
from app.runtime.errors import (
    ContainerGone,
    GitEgressDisabled,
    GitSourceRefused,
    WorkspaceRefused,
)
from app.runtime.git import egress as git_egress
from app.runtime.git.egress import (
    MAX_SCANNED_CHARS,
    LookupShares,
    clone_resolver,
    pin_remote,
    tenant_error,
)
from app.runtime.git.sources import (
    SOURCE,
    ClonePlan,
    check_local_path,
    check_ref,
    check_url,
    clone_env,
    clone_script,
    plan_clone,
    require_empty,
)
from auth.safe_fetch import system_resolver
from pool.slots import SlotsAt

# -- URLs --------------------------------------------------------------------------------

ACCEPTED_URLS = [
    "https://github.com/owner/repo.git",
    "https://github.com/owner/repo",
    "https://git.example.org:8443/group/sub/repo.git",
    "https://gitlab.example.com/a/b.git?ref=x",
    "https://10.0.0.1/repo.git",
]

REFUSED_URLS = {
    "http://github.com/o/r.git": "http:// is not allowed",
    "git://github.com/o/r.git": "git:// is not allowed",
    "ssh://git@github.com/o/r.git": "ssh:// is not allowed",
    "git+ssh://github.com/o/r.git": "git+ssh:// is not allowed",
    "file:///etc": "file:// is not allowed",
    "HTTPS://github.com/o/r.git": "not an https:// URL",
    "ext::sh": "remote helpers",
    "ext::https://github.com/o/r": "remote helpers",
    "fd::17": "remote helpers",
    "git@github.com:o/r.git": "not an https:// URL",
    "/srv/git/repo.git": "not an https:// URL",
    "github.com/o/r": "not an https:// URL",
    "https://user:secret@github.com/o/r.git": "credentials",
    "https://token@github.com/o/r.git": "credentials",
    "https://github.com@evil.example/o/r.git": "credentials",
    "-uhttps://github.com/o/r": "like an option",
    "--upload-pack=touch /tmp/x": "like an option",
    "https://github.com/o/r\n.git": "control characters",
    "https://github.com/o/r\x00": "control characters",
    "https://github.com/o/r\x7f": "control characters",
    "https://github.com/o/r%0a": "encoded control characters",
    "https://github.com/o/r%1B": "encoded control characters",
    "https://github.com/o r": "percent-encode",
    "https://github.com/o/r\\x": "percent-encode",
    'https://github.com/o/"r"': "percent-encode",
    "https://github.com/o/rë": "percent-encode",
    "https://[::1]/o/r": "not a host name",
    "https://-bad.example/o/r": "not a host name",
    "https:///o/r": "not a host name",
    "https://github.com:99999/o/r": "not a port",
    "https://github.com:x/o/r": "not a port",
    "https://github.com": "names no repository",
    "https://github.com/": "names no repository",
    "": "empty",
    "https://h/" + "a" * 2048: "longer than",
}


@pytest.mark.parametrize("url", ACCEPTED_URLS)
def test_plain_https_urls_are_accepted(url: str) -> None:
    assert check_url(url) == url


@pytest.mark.parametrize(("url", "reason"), REFUSED_URLS.items())
def test_other_urls_are_refused(url: str, reason: str) -> None:
    with pytest.raises(GitSourceRefused) as caught:
        check_url(url)
    assert caught.value.code == "GIT_SOURCE_REFUSED"
    assert caught.value.details["field"] == "url"
    assert reason in str(caught.value.details["reason"])


def test_a_refused_url_is_never_echoed() -> None:
    for url in ("https://user:hunter2@github.com/o/r", "hunter2://github.com/o/r"):
        with pytest.raises(GitSourceRefused) as caught:
            check_url(url)
        assert "hunter2" not in caught.value.message
        assert "hunter2" not in str(caught.value.details)


# -- refs --------------------------------------------------------------------------------

ACCEPTED_REFS = [
    "main",
    "v1",
    "v1.2.0",
    "feature/x",
    "release-1_2",
    "deadbeef",
    "0123456789abcdef0123456789abcdef01234567",
    "a" * 200,
]

REFUSED_REFS = {
    "": "empty",
    "a" * 201: "longer than 200",
    "-b": "like an option",
    "--upload-pack=touch": "like an option",
    "a..b": "'..'",
    "..": "'..'",
    "a b": "only letters",
    "a~1": "only letters",
    "a^{}": "only letters",
    "HEAD@{1}": "only letters",
    "a:b": "only letters",
    "a;rm": "only letters",
    "$(id)": "only letters",
    "a\nb": "only letters",
    "a\x00": "only letters",
    "ré": "only letters",
    "/a": "empty",
    "a/": "empty",
    "a//b": "empty",
    ".hidden": "starts with '.'",
    "a/.b": "starts with '.'",
    "a.lock": ".lock",
    "a.lock/b": ".lock",
    "a.": "ends with '.'",
}


@pytest.mark.parametrize("ref", ACCEPTED_REFS)
def test_plain_refs_are_accepted(ref: str) -> None:
    assert check_ref(ref) == ref


@pytest.mark.parametrize(("ref", "reason"), REFUSED_REFS.items())
def test_other_refs_are_refused(ref: str, reason: str) -> None:
    with pytest.raises(GitSourceRefused) as caught:
        check_ref(ref)
    assert caught.value.details["field"] == "ref"
    assert reason in str(caught.value.details["reason"])


# -- local paths -------------------------------------------------------------------------


@pytest.fixture
def slots(tmp_path: Path) -> Path:
    workspace = tmp_path / "slots" / "slot-000" / "ws"
    workspace.mkdir(parents=True)
    (tmp_path / "slots" / "slot-001" / "repo" / ".git").mkdir(parents=True)
    return (tmp_path / "slots").resolve()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "elsewhere" / "repo" / ".git").mkdir(parents=True)
    return (tmp_path / "elsewhere" / "repo").resolve()


def refused_path(path: Path, slots: Path) -> str:
    with pytest.raises(GitSourceRefused) as caught:
        check_local_path(path, slots)
    assert caught.value.details["field"] == "local_path"
    assert str(slots.parent) not in caught.value.message, "messages never hold host paths"
    return str(caught.value.details["reason"])


def test_a_repository_outside_the_slots_is_accepted(repo: Path, slots: Path) -> None:
    assert check_local_path(repo, slots) == repo.resolve()
    link = repo.parent / "link"
    link.symlink_to(repo)
    assert check_local_path(link, slots) == repo.resolve(), "mounted by its real path"


def test_local_paths_that_may_not_be_mounted_are_refused(
    repo: Path, slots: Path, tmp_path: Path
) -> None:
    assert refused_path(Path("elsewhere/repo"), slots) == "not an absolute path"
    assert refused_path(tmp_path / "missing", slots) == "not an existing folder"
    (tmp_path / "file").write_text("x")
    assert refused_path(tmp_path / "file", slots) == "not an existing folder"
    inside = "it lies inside the sandboxes' storage"
    assert refused_path(slots / "slot-001" / "repo", slots) == inside
    assert refused_path(slots / "slot-000" / "ws", slots) == inside
    assert refused_path(slots, slots) == inside
    assert refused_path(slots / "slot-000" / ".." / "slot-001" / "repo", slots) == inside
    into_a_slot = tmp_path / "into-a-slot"
    into_a_slot.symlink_to(slots / "slot-001" / "repo")
    assert refused_path(into_a_slot, slots) == inside
    assert refused_path(tmp_path, slots) == "it contains the sandboxes' storage"
    assert refused_path(Path("/"), slots) == "it contains the sandboxes' storage"


def test_plan_clone_takes_the_local_path_over_the_url(repo: Path, slots: Path) -> None:
    plan = plan_clone(GitSource("anything at all", "v1", repo), slots)
    assert plan == ClonePlan(SOURCE, "v1", repo.resolve())
    assert plan.protocol == "file"
    remote = plan_clone(GitSource("https://github.com/o/r.git"), slots)
    assert remote == ClonePlan("https://github.com/o/r.git", None, None)
    assert remote.protocol == "https"
    with pytest.raises(GitSourceRefused):
        plan_clone(GitSource("anything", "-x", repo), slots)
    with pytest.raises(GitSourceRefused):
        plan_clone(GitSource("http://github.com/o/r.git"), slots)


def test_only_an_empty_workspace_is_cloned_into(slots: Path) -> None:
    workspace = slots / "slot-000" / "ws"
    require_empty(workspace)
    (workspace / ".hidden").write_text("x")
    with pytest.raises(WorkspaceRefused, match="empty"):
        require_empty(workspace)


# -- the script --------------------------------------------------------------------------

FAKE_GIT = """#!/bin/sh
for a in "$@"; do printf '%s\\n' "$a"; done >> "$ARGV_LOG"
printf '%s\\n' '<end>' >> "$ARGV_LOG"
case " $* " in *" --branch "*) exit "${FAIL_BRANCH:-0}" ;; esac
exit 0
"""


def run_script(
    plan: ClonePlan, tmp_path: Path, fail_branch: int = 0
) -> tuple[int, list[list[str]], str]:
    """Run the script with a fake git on PATH; its status, each git argv, stderr."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "git").write_text(FAKE_GIT)
    (bin_dir / "git").chmod(0o755)
    log = tmp_path / "argv.log"
    log.write_text("")
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "ARGV_LOG": str(log),
        "FAIL_BRANCH": str(fail_branch),
        "HOME": str(tmp_path),
    }
    done = subprocess.run(
        ["/bin/sh", "-c", clone_script(plan)], env=env, capture_output=True, text=True
    )
    calls = [c.strip("\n").split("\n") for c in log.read_text().split("<end>\n") if c.strip()]
    return done.returncode, calls, done.stderr


SAFETY = [
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.symlinks=true",
    "-c",
    "transfer.fsckObjects=true",
    "-c",
    "submodule.recurse=false",
    "-c",
    "fetch.recurseSubmodules=false",
    "-c",
    "protocol.allow=never",
    "-c",
    "credential.helper=",
    "-c",
    "http.followRedirects=false",
    "-c",
    "advice.detachedHead=false",
]


def test_a_remote_clone_is_shallow_and_https_only(tmp_path: Path) -> None:
    url = "https://github.com/o/r'$(touch x)`id`.git"
    code, calls, _ = run_script(ClonePlan(url, "v1"), tmp_path)
    assert code == 0
    assert calls == [
        [
            *SAFETY,
            "-c",
            "protocol.https.allow=always",
            "clone",
            "--template=",
            "--depth=1",
            "--branch",
            "v1",
            "--",
            url,
            "/workspace",
        ]
    ]
    assert not (tmp_path / "x").exists(), "values are quoted, never run"
    assert "--recurse-submodules" not in clone_script(ClonePlan(url, None))


def test_a_remote_clone_is_pinned_to_the_checked_address(tmp_path: Path) -> None:
    plan = ClonePlan("https://github.com/o/r.git", None, pin="github.com:443:140.82.121.3")
    code, calls, _ = run_script(plan, tmp_path)
    assert code == 0
    assert calls[0][len(SAFETY) : len(SAFETY) + 4] == [
        "-c",
        "protocol.https.allow=always",
        "-c",
        "http.curloptResolve=github.com:443:140.82.121.3",
    ]


def test_a_local_clone_keeps_history_and_trusts_only_the_mount(tmp_path: Path) -> None:
    code, calls, _ = run_script(ClonePlan(SOURCE, None, Path("/host/repo")), tmp_path)
    assert code == 0
    assert calls[:2] == [
        ["config", "--global", "--add", "safe.directory", "/source"],
        ["config", "--global", "--add", "safe.directory", "/source/.git"],
    ]
    assert calls[2] == [
        *SAFETY,
        "-c",
        "protocol.file.allow=always",
        "clone",
        "--template=",
        "--no-local",
        "--",
        "/source",
        "/workspace",
    ]
    assert len(calls) == 3
    assert "/host/repo" not in clone_script(ClonePlan(SOURCE, None, Path("/host/repo")))


def test_a_ref_that_may_be_a_commit_falls_back_to_a_full_clone(tmp_path: Path) -> None:
    plan = ClonePlan("https://h.example/o/r", "abc1234")
    code, calls, _ = run_script(plan, tmp_path)
    assert code == 0
    assert len(calls) == 1, "found as a branch or tag: done"

    code, calls, stderr = run_script(plan, tmp_path, fail_branch=128)
    assert code == 0
    [shallow, full, checkout] = [c[len(SAFETY) + 2 :] for c in calls]
    assert shallow[:3] == ["clone", "--template=", "--depth=1"]
    assert full == ["clone", "--template=", "--no-checkout", "--", plan.url, "/workspace"]
    assert checkout == ["-C", "/workspace", "checkout", "--detach", "abc1234", "--"]
    assert "as a commit" in stderr


def test_a_branch_name_that_fails_does_not_fall_back(tmp_path: Path) -> None:
    code, calls, _ = run_script(ClonePlan("https://h.example/o/r", "feature"), tmp_path, 128)
    assert code == 128
    assert len(calls) == 1


def test_the_environment_pins_the_protocol_and_forbids_prompts() -> None:
    assert clone_env(ClonePlan("https://h.example/o/r", None)) == {
        "GIT_ALLOW_PROTOCOL": "https",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C.UTF-8",
    }
    assert clone_env(ClonePlan(SOURCE, None, Path("/r")))["GIT_ALLOW_PROTOCOL"] == "file"


# -- the helper's spec (a fake engine: no container ever starts) -------------------------

PREFIX = "io.sandbox-mcp-unit"
IMAGES = ("sandbox-mcp/python:3", "sandbox-mcp/base:bookworm")


class FakeApi:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.created: dict[str, Any] = {}
        self.live: list[dict[str, str]] = []
        self.removed: list[str] = []
        self.network_names: list[str] = []
        self.network_options: dict[str, Any] = {}

    def create_host_config(self, **kwargs: Any) -> HostConfig:
        return HostConfig(version="1.41", **kwargs)

    def info(self) -> dict[str, Any]:
        self.calls.append("info")
        return {"NCPU": 2, "SecurityOptions": ["name=seccomp,profile=default"]}

    def containers(self, **kwargs: Any) -> list[dict[str, str]]:
        self.calls.append("containers")
        assert kwargs["filters"] == {"label": f"{PREFIX}.managed=1"}
        return self.live

    def create_container(self, image: str, **kwargs: Any) -> dict[str, str]:
        self.calls.append("create_container")
        self.created = {"image": image, **kwargs}
        self.live.append({"Id": "h" * 64})
        return {"Id": "h" * 64}

    def start(self, container_id: str) -> None:
        self.calls.append("start")

    def networks(self, names: list[str]) -> list[dict[str, Any]]:
        self.calls.append("networks")
        return [{"Name": n} for n in names if n in self.network_names]

    def create_network(self, name: str, **kwargs: Any) -> dict[str, str]:
        self.calls.append("create_network")
        self.network_names.append(name)
        self.network_options = kwargs
        return {"Id": "n" * 64}

    def remove_container(self, container_id: str, **kwargs: Any) -> None:
        self.calls.append("remove_container")
        self.removed.append(container_id)
        self.live = [c for c in self.live if c["Id"] != container_id]


class FakeClient:
    def __init__(self, api: FakeApi) -> None:
        self.api = api

    def close(self) -> None:
        pass


OK = ExecResult(0, "", "Cloning into '/workspace'...\n", False, False, 0.5)


async def public_dns(host: str, port: int) -> list[str]:
    """A resolver for names these tests use (no network here)."""
    return {"github.com": ["140.82.121.3"], "internal.example": ["10.0.0.5"]}.get(host, [])


def make_backend(
    slots: Path, api: FakeApi, ran: list[dict[str, Any]], result: Any = OK, **overrides: Any
) -> DockerBackend:
    options: dict[str, Any] = {
        "slots": SlotsAt(slots),
        "allowed_images": IMAGES,
        "git_image": "sandbox-mcp/base:bookworm",
        "label_prefix": PREFIX,
        "client_factory": lambda: FakeClient(api),
        "resolve": public_dns,
    }
    options.update(overrides)
    backend = DockerBackend(**options)

    async def run(container_id: str, command: str, **kwargs: Any) -> ExecResult:
        ran.append({"container_id": container_id, "command": command, **kwargs})
        if isinstance(result, BaseException):
            raise result
        if callable(result):
            return await result()  # type: ignore[no-any-return]
        assert isinstance(result, ExecResult)
        return result

    backend.run = run  # type: ignore[method-assign]
    return backend


async def test_a_local_clone_mounts_the_repository_read_only_without_network(
    slots: Path, repo: Path
) -> None:
    api, ran = FakeApi(), list[dict[str, Any]]()
    backend = make_backend(slots, api, ran)
    workspace = slots / "slot-000" / "ws"
    result = await backend.clone(GitSource("local", "v1", repo), workspace, timeout_s=60)
    assert result.exit_code == 0
    created = api.created
    assert created["image"] == "sandbox-mcp/base:bookworm"
    assert created["user"] == "1000:1000"
    assert created["entrypoint"] == ["sleep", "infinity"]
    assert created["labels"] == {f"{PREFIX}.managed": "1", f"{PREFIX}.role": "git-clone"}
    assert created["environment"]["GIT_ALLOW_PROTOCOL"] == "file"
    assert created["environment"]["HOME"] == "/home/sandbox"
    host = created["host_config"]
    assert host["NetworkMode"] == "none"
    assert host["Mounts"] == [
        {
            "Target": "/workspace",
            "Source": str(workspace),
            "Type": "bind",
            "ReadOnly": False,
        },
        {
            "Target": "/source",
            "Source": str(repo),
            "Type": "bind",
            "ReadOnly": True,
            "BindOptions": {"NonRecursive": True},
        },
    ]
    assert_hardened(host, pids=256, memory_mb=1024)
    [call] = ran
    assert call["job_id"] == "git-clone"
    assert call["timeout_s"] == 60
    assert "--branch v1" in call["command"]
    assert api.removed == ["h" * 64], "removed after success"


async def test_a_remote_clone_joins_the_egress_network_only_when_allowed(
    slots: Path,
) -> None:
    api, ran = FakeApi(), list[dict[str, Any]]()
    workspace = slots / "slot-000" / "ws"
    closed = make_backend(slots, api, ran, allow_egress=True)
    with pytest.raises(GitEgressDisabled) as caught:
        await closed.clone(GitSource("https://github.com/o/r.git"), workspace)
    assert caught.value.code == "GIT_EGRESS_DISABLED"
    assert api.calls == [], "refused before the engine is even asked"

    backend = make_backend(
        slots, api, ran, allow_git_egress=True, egress_network="bridge", git_network="git-out"
    )
    await backend.clone(GitSource("https://github.com/o/r.git", "main"), workspace)
    assert api.created["host_config"]["NetworkMode"] == "git-out", "its own, never the bridge"
    assert api.network_names == ["git-out"]
    assert api.network_options["options"] == {"com.docker.network.bridge.enable_icc": "false"}
    assert "http.curloptResolve=github.com:443:140.82.121.3" in ran[0]["command"]
    assert [m["Target"] for m in api.created["host_config"]["Mounts"]] == ["/workspace"]
    assert api.created["environment"]["GIT_ALLOW_PROTOCOL"] == "https"
    assert "--depth=1 --branch main" in ran[0]["command"]
    assert api.removed == ["h" * 64]


async def test_refusals_come_before_any_container(slots: Path, repo: Path) -> None:
    api, ran = FakeApi(), list[dict[str, Any]]()
    backend = make_backend(slots, api, ran, allow_git_egress=True)
    workspace = slots / "slot-000" / "ws"
    with pytest.raises(GitSourceRefused):
        await backend.clone(GitSource("local", None, slots / "slot-001" / "repo"), workspace)
    with pytest.raises(GitSourceRefused):
        await backend.clone(GitSource("git://github.com/o/r"), workspace)
    with pytest.raises(WorkspaceRefused, match="outside"):
        await backend.clone(GitSource("local", None, repo), repo.parent)
    (workspace / "x").write_text("x")
    with pytest.raises(WorkspaceRefused, match="empty"):
        await backend.clone(GitSource("local", None, repo), workspace)
    assert "create_container" not in api.calls
    assert ran == []


@pytest.mark.parametrize(
    "outcome",
    [
        ExecResult(128, "", "fatal: not found", False, False, 0.1),
        ExecResult(None, "", "", False, False, 300.0, timed_out=True),
        ContainerGone("h" * 64),
    ],
)
async def test_the_helper_is_removed_whatever_happens(
    slots: Path, repo: Path, outcome: Any
) -> None:
    api, ran = FakeApi(), list[dict[str, Any]]()
    backend = make_backend(slots, api, ran, result=outcome)
    workspace = slots / "slot-000" / "ws"
    if isinstance(outcome, BaseException):
        with pytest.raises(ContainerGone):
            await backend.clone(GitSource("local", None, repo), workspace)
    else:
        result = await backend.clone(GitSource("local", None, repo), workspace)
        assert (result.exit_code, result.timed_out) == (outcome.exit_code, outcome.timed_out)
    assert api.removed == ["h" * 64]


async def test_sweep_spares_a_clone_in_flight_but_not_a_leftover(slots: Path, repo: Path) -> None:
    api, ran = FakeApi(), list[dict[str, Any]]()
    swept: list[int] = []

    async def sweeping() -> ExecResult:
        swept.append(await backend.sweep(set()))
        return OK

    backend = make_backend(slots, api, ran, result=sweeping)
    api.live.append({"Id": "l" * 64})  # a helper left by an earlier process
    await backend.clone(GitSource("local", None, repo), slots / "slot-000" / "ws")
    assert swept == [1]
    assert api.removed == ["l" * 64, "h" * 64]


def test_the_git_image_must_be_allowed(slots: Path) -> None:
    with pytest.raises(ConfigurationError):
        DockerBackend(
            slots=SlotsAt(slots),
            allowed_images=IMAGES,
            client_factory=docker.from_env,  # never called: the image is refused first
            git_image="alpine/git:latest",
        )


# -- egress: public addresses only, pinned, generic errors (issue 12) --------------------


async def dns_with_internal_names(host: str, port: int) -> list[str]:
    """The system resolver, plus names a corporate DNS would answer privately."""
    fake = {
        "db.internal": ["10.0.0.5"],
        "rebind.example": ["140.82.121.3", "127.0.0.1"],
        "metadata.example": ["169.254.169.254"],
        "v6only.example": ["fd00::1"],
    }
    if host in fake:
        return fake[host]
    return await system_resolver(host, port)


REFUSED_URLS = [
    "https://169.254.169.254/latest/meta-data/",
    "https://10.0.0.5/o/r.git",
    "https://127.0.0.1/o/r.git",
    "https://192.168.1.1/o/r.git",
    "https://100.64.0.1/o/r.git",  # shared (carrier-grade NAT)
    "https://0.0.0.0/o/r.git",
    "https://[::1]/o/r.git",
    "https://[::ffff:127.0.0.1]/o/r.git",  # IPv4-mapped IPv6
    "https://[::ffff:a9fe:a9fe]/o/r.git",  # 169.254.169.254, mapped
    "https://[fd00::1]/o/r.git",
    "https://2130706433/o/r.git",  # 127.0.0.1 in decimal: getaddrinfo accepts it
    "https://017700000001/o/r.git",  # ... and in octal
    "https://0x7f.1/o/r.git",  # ... and in hex, short form
    "https://localhost/o/r.git",
    "https://db.internal/o/r.git",  # an internal name answering privately
    "https://metadata.example/computeMetadata/v1/",
    "https://rebind.example/o/r.git",  # one public answer is not enough
    "https://v6only.example/o/r.git",
    "https://does-not-exist.invalid/o/r.git",  # same words as a private answer
    "https://github.com:8443/o/r.git",  # a port prober's other ports
]


@pytest.mark.parametrize("url", REFUSED_URLS)
async def test_a_clone_of_a_non_public_address_is_refused_before_the_engine(
    slots: Path, url: str
) -> None:
    api, ran = FakeApi(), list[dict[str, Any]]()
    backend = make_backend(slots, api, ran, allow_git_egress=True, resolve=dns_with_internal_names)
    with pytest.raises(GitSourceRefused) as caught:
        await backend.clone(GitSource(url), slots / "slot-000" / "ws")
    assert caught.value.details["field"] == "url"
    assert "create_container" not in api.calls
    assert "create_network" not in api.calls
    assert ran == []
    for detail in ("169.254", "10.0.0.5", "127.0.0.1", "8443", "internal"):
        assert detail not in caught.value.message


@pytest.mark.parametrize(
    ("url", "answers", "pin"),
    [
        ("https://github.com/o/r.git", ["140.82.121.3"], "github.com:443:140.82.121.3"),
        ("https://140.82.121.3/o/r.git", [], "140.82.121.3:443:140.82.121.3"),
        (
            "https://dual.example/o/r.git",
            ["2606:4700::1111", "1.1.1.1"],
            "dual.example:443:1.1.1.1",
        ),
        ("https://v6.example:443/o/r", ["2606:4700::1111"], "v6.example:443:[2606:4700::1111]"),
    ],
)
async def test_a_public_host_is_pinned_to_its_checked_address(
    url: str, answers: list[str], pin: str
) -> None:
    async def dns(host: str, port: int) -> list[str]:
        assert port == 443
        return answers

    assert await pin_remote(url, resolve=dns) == pin


async def test_git_error_lines_never_reach_the_tenant(slots: Path) -> None:
    stderr = (
        "Cloning into '/workspace'...\n"
        "fatal: unable to access 'https://github.com/o/r.git/': Failed to connect to "
        "github.com port 443 after 3 ms: Connection refused\n"
    )
    api, ran = FakeApi(), list[dict[str, Any]]()
    failed = ExecResult(128, "some stdout", stderr, False, False, 0.5)
    backend = make_backend(slots, api, ran, failed, allow_git_egress=True)
    result = await backend.clone(GitSource("https://github.com/o/r.git"), slots / "slot-000" / "ws")
    assert result.exit_code == 128
    assert result.stdout == ""
    assert result.stderr == "the server could not be reached over https, or the clone failed"


@pytest.mark.parametrize(
    ("stderr", "said"),
    [
        ("fatal: repository 'https://h/o/r/' not found", "was not found"),
        (
            "warning: Could not find remote branch nope to clone.\nfatal: Remote branch nope "
            "not found in upstream origin",
            "the ref was not found",
        ),
        (
            "fatal: could not read Username for 'https://h': terminal prompts disabled",
            "credentials",
        ),
        (
            "fatal: unable to access 'https://h/': SSL certificate problem: self-signed "
            "certificate",
            "TLS certificate",
        ),
        (
            "fatal: unable to update url base from redirection:\n  asked for: https://h/x",
            "redirect",
        ),
        ("fatal: unable to access 'https://h/': The requested URL returned error: 503", "5xx"),
        ("fatal: unable to access 'https://h/': Could not resolve host: h", "could not be reached"),
        ("fatal: unable to access 'https://h/': Operation timed out after 300000 ms", "reached"),
    ],
)
def test_each_failure_is_one_fixed_sentence(stderr: str, said: str) -> None:
    sentence = tenant_error(stderr)
    assert said in sentence
    assert "https://h" not in sentence


def test_a_remote_s_flood_of_lines_is_read_from_its_tail_only() -> None:
    # The tenant's own https server fills stderr with ``remote:`` lines up to the 1 MB
    # output cap; matched line by line on the event loop, that took 1.2-1.8 s.
    flood = "remote: x\n" * (1_048_576 // 10)
    fatal = "fatal: repository 'https://h/o/r/' not found"
    stderr = flood + fatal

    def fastest(text: str) -> float:
        took = []
        for _ in range(3):
            started = time.perf_counter()
            tenant_error(text)
            took.append(time.perf_counter() - started)
        return min(took)

    floor, whole = fastest(stderr[-MAX_SCANNED_CHARS:]), fastest(stderr)
    print(f"\n1 MB of remote lines: {whole * 1000:.1f} ms; its last 16 KB: {floor * 1000:.1f} ms")
    assert "was not found" in tenant_error(stderr)
    # A sentence only before the tail is never read, and reading costs what the tail does.
    assert tenant_error(fatal + "\n" + flood) == tenant_error("")
    assert whole < 10 * floor + 0.005, (whole, floor)


async def test_a_clone_s_slow_lookups_leave_the_sign_in_s_dns_threads_free(
    slow_dns: SlowNameserver,
) -> None:
    # A tenant's nameserver that never answers holds each lookup's thread long after
    # pin_remote stops waiting; the clone used the four threads sign-ins look up on.
    release, entered = slow_dns.release, slow_dns.entered
    clones = [asyncio.create_task(pin_remote(f"https://h{n}.slow.example/r")) for n in range(8)]
    try:
        for _ in range(4):  # four lookups are blocked in their threads
            assert await asyncio.to_thread(entered.acquire, timeout=60)
        signin = asyncio.create_task(system_resolver("client.example", 443))
        done, _ = await asyncio.wait({signin, *clones}, timeout=60, return_when="FIRST_COMPLETED")
        assert done == {signin}, "the sign-in's lookup waited behind the clones'"
        assert signin.result() == ["93.184.216.34"]
    finally:
        release.set()
        results = await asyncio.gather(*clones, return_exceptions=True)
    assert all(isinstance(r, GitSourceRefused) for r in results), results


async def test_one_address_s_clones_hold_only_its_share_of_the_clone_dns_threads(
    slow_dns: SlowNameserver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One address's eight sandboxes clone hosts whose nameserver never answers; without a
    # share they held all four clone threads and another address's clone waited behind them.
    release, entered = slow_dns.release, slow_dns.entered
    monkeypatch.setattr(git_egress, "RESOLVE_TIMEOUT_S", 300.0)  # no clone gives up here
    shares = LookupShares()

    def clone_of(url: str, sandbox: str, address: str) -> asyncio.Task[str]:
        resolve = shares.bounded(clone_resolver, sandbox, address)
        return asyncio.create_task(pin_remote(url, resolve=resolve))

    heavy = [clone_of(f"https://h{n}.slow.example/r", f"s{n}", "addr-a") for n in range(8)]
    # The same sandbox twice: its second lookup waits for its first.
    heavy += [clone_of("https://again.slow.example/r", "s0", "addr-b")]
    try:
        for _ in range(LookupShares().per_address):  # addr-a's share is in its threads
            assert await asyncio.to_thread(entered.acquire, timeout=60)
        other = clone_of("https://other.example/r", "t0", "addr-b")
        done, _ = await asyncio.wait({other, *heavy}, timeout=60, return_when="FIRST_COMPLETED")
        assert done == {other}, "another address's clone waited behind addr-a's lookups"
        assert other.result() == "other.example:443:93.184.216.34"
        # addr-a's two and nobody else's: s0's second lookup never reached a thread.
        assert not entered.acquire(timeout=0)
    finally:
        release.set()
        results = await asyncio.gather(*heavy, return_exceptions=True)
    assert all(isinstance(r, GitSourceRefused) for r in results), results
    assert shares.idle  # every gate dropped once idle
