"""DockerBackend without a daemon: spec validation, the host config it asks for, errors.

A fake low-level client records what the backend sends; the real daemon is
exercised in tests/integration/runtime/test_docker_backend.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker.errors
import pytest
import requests
from docker.types import HostConfig
from hardening_checks import assert_hardened

from app.errors import ConfigurationError, InvalidArgument, LimitReached
from app.runtime.backend import ContainerSpec, Limits
from app.runtime.backends.docker import DockerBackend
from app.runtime.docker.hardening import refuse_docker_socket_in
from app.runtime.errors import (
    CapacityExceeded,
    ContainerGone,
    EgressDisabled,
    ImageMissing,
    ImageNotAllowed,
    RuntimeUnavailable,
    WorkspaceRefused,
)
from app.runtime.limits import Ceilings
from pool.slots import SlotsAt

IMAGES = ("sandbox-mcp/python:3", "sandbox-mcp/base:bookworm")


def http_error(status: int, message: str = "boom") -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status
    return docker.errors.APIError(message, response=response, explanation=message)


class FakeApi:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.created: dict[str, Any] = {}
        self.live: list[dict[str, Any]] = []
        self.removed: list[str] = []
        self.started: list[str] = []
        self.fail: dict[str, BaseException] = {}

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise self.fail[name]

    def create_host_config(self, **kwargs: Any) -> HostConfig:
        return HostConfig(version="1.41", **kwargs)

    security_options: tuple[str, ...] = ("name=apparmor", "name=seccomp,profile=default")

    def info(self) -> dict[str, Any]:
        self._call("info")
        return {"NCPU": 2, "SecurityOptions": list(self.security_options)}

    def version(self) -> dict[str, Any]:
        self._call("version")
        return {"Version": "20.10.24"}

    def images(self) -> list[dict[str, Any]]:
        self._call("images")
        return [{"RepoTags": ["sandbox-mcp/python:3"]}, {"RepoTags": None}]

    def containers(self, **kwargs: Any) -> list[dict[str, Any]]:
        self._call("containers")
        assert kwargs["filters"] == {"label": "io.sandbox-mcp-unit.managed=1"}
        return self.live

    def create_container(self, image: str, **kwargs: Any) -> dict[str, str]:
        self._call("create_container")
        self.created = {"image": image, **kwargs}
        return {"Id": "c" * 64}

    def start(self, container_id: str) -> None:
        self._call("start")
        self.started.append(container_id)

    def remove_container(self, container_id: str, **kwargs: Any) -> None:
        self._call("remove_container")
        self.removed.append(container_id)

    def exec_create(self, container_id: str, cmd: list[str], **kwargs: Any) -> dict[str, str]:
        self._call("exec_create")
        return {"Id": "e" * 64}


class FakeClient:
    def __init__(self, api: FakeApi) -> None:
        self.api = api

    def close(self) -> None:
        pass


@pytest.fixture
def slots(tmp_path: Path) -> Path:
    (tmp_path / "slots" / "slot-000" / "ws").mkdir(parents=True)
    return tmp_path / "slots"


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


def make_backend(slots: Path, api: FakeApi, **overrides: Any) -> DockerBackend:
    options: dict[str, Any] = {
        "slots": SlotsAt(slots),
        "allowed_images": IMAGES,
        "label_prefix": "io.sandbox-mcp-unit",
        "client_factory": lambda: FakeClient(api),
        "max_containers": 5,
    }
    options.update(overrides)
    return DockerBackend(**options)


def spec(slots: Path, **overrides: Any) -> ContainerSpec:
    values: dict[str, Any] = {
        "experiment_id": "exp-1",
        "sandbox_label": "fp-abc",
        "image": IMAGES[0],
        "workspace": slots / "slot-000" / "ws",
    }
    values.update(overrides)
    return ContainerSpec(**values)


async def test_create_asks_for_every_hardening_flag(slots: Path, api: FakeApi) -> None:
    container = await make_backend(slots, api).create(spec(slots))
    created = api.created
    host = created["host_config"]
    assert host.get("Privileged", False) is False  # the SDK omits the default
    assert_hardened(host, pids=256, memory_mb=1024)
    assert host["Tmpfs"]["/tmp"] == "rw,exec,nosuid,nodev,size=256m,mode=1777"
    assert "uid=1000,gid=1000" in host["Tmpfs"]["/home/sandbox"]
    [mount] = host["Mounts"]
    assert mount["Type"] == "bind"
    assert mount["Target"] == "/workspace"
    assert mount["Source"] == str((slots / "slot-000" / "ws").resolve())
    assert mount["ReadOnly"] is False
    assert created["user"] == "1000:1000"
    assert created["entrypoint"] == ["sleep", "infinity"]
    assert created["labels"] == {
        "io.sandbox-mcp-unit.managed": "1",
        "io.sandbox-mcp-unit.experiment": "exp-1",
        "io.sandbox-mcp-unit.sandbox": "fp-abc",
    }
    assert container.warnings == ()
    assert container.isolation.network == "none"
    assert container.isolation.writable_mounts == ("/workspace", "/tmp", "/home/sandbox")


async def test_limits_are_clamped_and_the_clamps_reported(slots: Path, api: FakeApi) -> None:
    backend = make_backend(slots, api, ceilings=Ceilings(memory_mb=4096))
    asked = Limits(cpus=8, memory_mb=20000, pids=1, tmp_mb=64)
    container = await backend.create(spec(slots, limits=asked))
    assert container.warnings == (
        "cpus 8 is above the 2 CPUs of this host; clamped to 2",
        "memory_mb 20000 is above the ceiling; clamped to 4096",
        "pids 1 is below the minimum; raised to 32",
    )
    host = api.created["host_config"]
    assert host["NanoCpus"] == 2_000_000_000
    assert host["Memory"] == 4096 * 1024 * 1024
    assert host["PidsLimit"] == 32
    assert (container.isolation.cpus, container.isolation.memory_mb) == (2, 4096)


async def test_an_image_outside_the_allow_list_is_refused_before_the_engine(
    slots: Path, api: FakeApi
) -> None:
    with pytest.raises(ImageNotAllowed) as caught:
        await make_backend(slots, api).create(spec(slots, image="alpine:latest"))
    assert caught.value.code == "IMAGE_NOT_ALLOWED"
    assert api.calls == []


async def test_no_image_means_the_default_image(slots: Path, api: FakeApi) -> None:
    backend = make_backend(slots, api, default_image=IMAGES[1])
    container = await backend.create(spec(slots, image=""))
    assert api.created["image"] == IMAGES[1]
    assert container.isolation.image == IMAGES[1]


async def test_an_allowed_image_that_is_not_built_is_image_missing(
    slots: Path, api: FakeApi
) -> None:
    api.fail["create_container"] = docker.errors.ImageNotFound("No such image")
    with pytest.raises(ImageMissing) as caught:
        await make_backend(slots, api).create(spec(slots))
    assert "deploy/build-base-image" in caught.value.message


async def test_egress_is_refused_unless_the_operator_allows_it(slots: Path, api: FakeApi) -> None:
    with pytest.raises(EgressDisabled):
        await make_backend(slots, api).create(spec(slots, network="egress"))
    assert api.calls == []
    await make_backend(slots, api, allow_egress=True).create(spec(slots, network="egress"))
    assert api.created["host_config"]["NetworkMode"] == "bridge"


async def test_an_unknown_network_is_an_invalid_argument(slots: Path, api: FakeApi) -> None:
    with pytest.raises(InvalidArgument):
        await make_backend(slots, api).create(spec(slots, network="host"))


async def test_a_workspace_outside_the_slots_is_refused_before_the_engine(
    slots: Path, api: FakeApi, tmp_path: Path
) -> None:
    with pytest.raises(WorkspaceRefused) as caught:
        await make_backend(slots, api).create(spec(slots, workspace=tmp_path))
    assert str(tmp_path) not in caught.value.message
    assert "create_container" not in api.calls


async def test_the_server_wide_container_cap_is_enforced(slots: Path, api: FakeApi) -> None:
    api.live = [{"Id": str(i)} for i in range(5)]
    with pytest.raises(CapacityExceeded) as caught:
        await make_backend(slots, api).create(spec(slots))
    assert caught.value.details == {"limit": 5, "reason": "server_full"}
    assert "create_container" not in api.calls


async def test_the_engine_count_is_shared_by_sandbox_label(slots: Path, api: FakeApi) -> None:
    # A pool of 3 and 4 containers: one spare beyond a first for every slot.
    label = "io.sandbox-mcp-unit.sandbox"
    api.live = [
        {"Id": "1", "Names": ["/one"], "Labels": {label: "fp-abc"}},
        {"Id": "2", "Names": ["/two"], "Labels": {label: "fp-b"}},
    ]
    backend = make_backend(slots, api, max_containers=4, pool_size=3)
    await backend.create(spec(slots))  # fp-abc's second: the spare
    api.live.append({"Id": "3", "Names": ["/three"], "Labels": {label: "fp-abc"}})
    with pytest.raises(CapacityExceeded) as caught:
        await backend.create(spec(slots))  # fp-abc's third: no spare left
    assert caught.value.details == {"limit": 4, "spare": 1, "reason": "spare_in_use"}
    await backend.create(spec(slots, sandbox_label="fp-c"))  # a first always fits
    assert api.created["labels"]["io.sandbox-mcp-unit.sandbox"] == "fp-c"


async def test_a_sandbox_at_its_own_container_cap_gets_limit_reached(
    slots: Path, api: FakeApi
) -> None:
    label = "io.sandbox-mcp-unit.sandbox"
    api.live = [{"Id": str(i), "Labels": {label: "fp-abc"}} for i in range(2)]
    backend = make_backend(slots, api, max_containers=50, max_containers_per_sandbox=2)
    with pytest.raises(LimitReached) as caught:
        await backend.create(spec(slots))
    assert caught.value.details == {"limit": "containers_per_sandbox", "value": 2}
    assert "destroy_experiment" in caught.value.message
    assert "create_container" not in api.calls


def test_fewer_containers_than_slots_is_refused(slots: Path, api: FakeApi) -> None:
    with pytest.raises(ConfigurationError, match="at least the pool size"):
        make_backend(slots, api, max_containers=4, pool_size=5)


async def test_a_container_that_fails_to_start_is_removed(slots: Path, api: FakeApi) -> None:
    api.fail["start"] = http_error(500, "failed to mount /srv/secret/path")
    with pytest.raises(RuntimeUnavailable) as caught:
        await make_backend(slots, api).create(spec(slots))
    assert api.removed == ["c" * 64]
    assert "/srv" not in caught.value.message, "engine text may hold host paths"
    assert "HTTP 500" in caught.value.message


async def test_info_reports_present_and_missing_images(slots: Path, api: FakeApi) -> None:
    info = await make_backend(slots, api).info()
    assert info.reachable
    assert info.version == "20.10.24"
    assert info.images == ("sandbox-mcp/python:3",)
    assert info.missing_images == ("sandbox-mcp/base:bookworm",)


@pytest.mark.parametrize("options", [(), ("name=apparmor",), ("name=seccomp,profile=unconfined",)])
async def test_without_an_active_seccomp_profile_no_container_is_made(
    slots: Path, api: FakeApi, options: tuple[str, ...]
) -> None:
    api.security_options = options
    backend = make_backend(slots, api)
    with pytest.raises(RuntimeUnavailable) as caught:
        await backend.create(spec(slots))
    assert "seccomp" in caught.value.message
    assert "create_container" not in api.calls
    info = await backend.info()
    assert not info.reachable
    assert info.reason is not None
    assert "seccomp" in info.reason


async def test_info_never_raises(slots: Path) -> None:
    def unreachable() -> Any:
        raise docker.errors.DockerException("Error while fetching server API version")

    info = await make_backend(slots, FakeApi(), client_factory=unreachable).info()
    assert not info.reachable
    assert info.reason == "the Docker engine cannot be reached"
    assert info.missing_images == IMAGES

    def broken() -> Any:
        raise ZeroDivisionError

    info = await make_backend(slots, FakeApi(), client_factory=broken).info()
    assert not info.reachable


async def test_remove_is_idempotent(slots: Path, api: FakeApi) -> None:
    backend = make_backend(slots, api)
    api.fail["remove_container"] = docker.errors.NotFound("No such container")
    await backend.remove("x")
    api.fail["remove_container"] = http_error(409, "removal of container x is already in progress")
    await backend.remove("x")
    api.fail["remove_container"] = requests.ConnectionError("refused")
    with pytest.raises(RuntimeUnavailable):
        await backend.remove("x")


async def test_sweep_removes_labelled_containers_that_are_not_live(
    slots: Path, api: FakeApi
) -> None:
    live, orphan = "a" * 64, "b" * 64
    api.live = [{"Id": live}, {"Id": orphan}]
    removed = await make_backend(slots, api).sweep({live[:12]})
    assert removed == 1
    assert api.removed == [orphan]


async def test_sweep_spares_what_a_live_process_creates_and_labels_its_own(
    slots: Path, api: FakeApi
) -> None:
    label = "io.sandbox-mcp-unit.process"
    mine, theirs, dead = "a" * 64, "b" * 64, "c" * 64
    api.live = [
        {"Id": mine, "Labels": {label: "proc_me"}},
        {"Id": theirs, "Labels": {label: "proc_alive"}},  # being created over there
        {"Id": dead, "Labels": {label: "proc_dead"}},
    ]
    backend = make_backend(slots, api, process_id="proc_me")
    assert await backend.sweep(set(), frozenset({"proc_me", "proc_alive"})) == 1
    assert api.removed == [dead]
    await backend.create(spec(slots))
    assert api.created["labels"][label] == "proc_me"


async def test_revive_starts_only_stopped_containers_of_live_experiments(
    slots: Path, api: FakeApi
) -> None:
    stopped, running, foreign = "a" * 64, "b" * 64, "c" * 64
    api.live = [
        {"Id": stopped, "State": "exited"},
        {"Id": running, "State": "running"},
        {"Id": foreign, "State": "exited"},  # no live experiment: the sweep's, not ours
    ]
    gone = "d" * 12
    revival = await make_backend(slots, api).revive({stopped[:12], running[:12], gone})
    assert revival.started == [stopped]
    assert revival.missing == [gone]
    assert api.started == [stopped]


async def test_run_refuses_an_odd_job_id_before_the_engine(slots: Path, api: FakeApi) -> None:
    with pytest.raises(InvalidArgument):
        await make_backend(slots, api).run("c", "true", timeout_s=5, job_id="a b")
    assert api.calls == []


async def test_run_in_a_missing_container_is_container_gone(slots: Path, api: FakeApi) -> None:
    api.fail["exec_create"] = docker.errors.NotFound("No such container: c")
    with pytest.raises(ContainerGone) as caught:
        await make_backend(slots, api).run("c" * 64, "true", timeout_s=5, job_id="j1")
    assert caught.value.code == "CONTAINER_GONE"
    backend = make_backend(slots, api)
    api.fail["exec_create"] = http_error(409, "Container c is not running")
    with pytest.raises(ContainerGone):
        await backend.run("c" * 64, "true", timeout_s=5, job_id="j1")
    assert not await backend.cancel("c" * 64, "j1"), "a failed run leaves no job behind"


async def test_cancel_of_an_unknown_job_is_false(slots: Path, api: FakeApi) -> None:
    assert not await make_backend(slots, api).cancel("c", "nope")


@pytest.mark.parametrize(
    "overrides",
    [
        {"allowed_images": ()},
        {"default_image": "other:1"},
        {"user_ids": (0, 0)},
        {"user_ids": (0, 1000)},
        {"label_prefix": "Bad Prefix"},
        {"max_containers": 0},
        {"home": "/"},
    ],
)
def test_bad_configuration_is_refused_at_construction(
    slots: Path, api: FakeApi, overrides: dict[str, Any]
) -> None:
    with pytest.raises(ConfigurationError):
        make_backend(slots, api, **overrides)


@pytest.mark.parametrize(
    "host_config",
    [
        {"Binds": ["/var/run/docker.sock:/var/run/docker.sock:rw"]},
        {"Mounts": [{"Type": "bind", "Source": "/run", "Target": "/x"}]},
        {"Mounts": [{"Type": "bind", "Source": "/", "Target": "/host"}]},
    ],
)
def test_a_host_config_exposing_the_docker_socket_is_refused(host_config: dict[str, Any]) -> None:
    with pytest.raises(WorkspaceRefused):
        refuse_docker_socket_in(host_config)
