"""The container runtime: which images, as which user, how many containers, and the
most one experiment may get (its ceilings)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from app.settings.base import Group

if TYPE_CHECKING:
    from app.runtime.limits import Ceilings


class RuntimeSettings(Group):
    images: str = Field(
        default="sandbox-mcp/python:3,sandbox-mcp/node:22,sandbox-mcp/node:18,sandbox-mcp/base:bookworm",
        description="Comma-separated allow-list of images experiments may use (built locally).",
    )
    default_image: str = Field(
        default="sandbox-mcp/python:3", description="The image used when none is asked for."
    )
    sandbox_user: str = Field(
        default="1000:1000",
        description="uid:gid the commands run as inside containers (never root).",
    )
    exec_path: Literal["auto", "docker-exec"] = Field(
        default="auto",
        description=(
            "How commands reach a container: auto runs them through the container's "
            "persistent executor when it is ready (falling back to docker exec), "
            "docker-exec runs each through its own docker exec."
        ),
    )
    max_containers: int | None = Field(
        default=None,
        ge=1,
        le=20_000,
        description=(
            "Live experiment containers, server-wide; at least POOL_SIZE, as every sandbox is "
            "promised one (second and later experiments share the rest). Default: twice "
            "POOL_SIZE (an idle container costs about 3.6 MB)."
        ),
    )
    warm_containers: int = Field(
        default=2,
        ge=0,
        le=100,
        description=(
            "The warm pool's floor: containers of the default image kept started and "
            "hardened, each in one of the "
            "free slots handed out next, so a new sandbox's first experiment starts without "
            "waiting for Docker (0: none). Each counts as its slot's promised container; an "
            "idle one costs about 20 MB (tests/bench/bench_warm.py). It grows past this with "
            "demand, within WARM_MAX_CONTAINERS and WARM_MEMORY_MB."
        ),
    )
    warm_max_containers: int = Field(
        default=128,
        ge=0,
        le=10_000,
        description=(
            "The most warm containers the pool grows to when demand rises (sign-ins whose "
            "first call has not come yet, a forming queue, the recent rate of creates); "
            "it shrinks back to WARM_CONTAINERS when idle. Also bounded by WARM_MEMORY_MB "
            "and by the free slots."
        ),
    )
    warm_memory_mb: int = Field(
        default=2560,
        ge=0,
        le=1_048_576,
        description=(
            "Host memory the idle warm containers may take, counted at 20 MB each (about "
            "6.2 MB in the container's cgroup, sleep and its executor, plus 13-14 MB for its "
            "containerd shim, measured by tests/bench/bench_warm.py): at the default, 128."
        ),
    )
    warm_prepared: bool = Field(
        default=True,
        description=(
            "After each create_experiment, start one container like it in the background for "
            "the sandbox's next experiment (one per sandbox holding a slot, within "
            "WARM_MAX_CONTAINERS and WARM_MEMORY_MB beside the warm pool, never its floor; "
            "begun once no create has been in flight for 2 s, a minute at most; sent to the "
            "engine only when no real creation waits)."
        ),
    )
    warm_rate_window_s: int = Field(
        default=60,
        ge=1,
        le=3600,
        description=(
            "How far back the warm pool counts creates: those of the last this many seconds, "
            "scaled to the next 10 s, add to its size, so a burst keeps it grown for this "
            "long after its last create and then it shrinks back to WARM_CONTAINERS."
        ),
    )
    engine_creates: int = Field(
        default=8,
        ge=1,
        le=256,
        description=(
            "Container creations (create and start) sent to the engine at once, cold and "
            "warm; more wait their turn in arrival order. The engine has locks of its own: past "
            "a few at once it only queues them (tests/bench/bench_engine_concurrency.py)."
        ),
    )
    label_prefix: str = Field(
        default="io.sandbox-mcp",
        pattern=r"^[a-z0-9]+([.-][a-z0-9]+)*$",
        description=(
            "Prefix of the Docker labels on our containers; servers sharing one Docker engine "
            "need different ones (each counts and sweeps the containers with its own)."
        ),
    )
    max_cpus: float = Field(default=4, gt=0, le=256, description="Ceiling on CPUs per experiment.")
    max_memory_mb: int = Field(
        default=8192, ge=64, le=1_048_576, description="Ceiling on memory per experiment (MB)."
    )
    max_pids: int = Field(
        default=2048, ge=16, le=1_000_000, description="Ceiling on processes per experiment."
    )
    max_command_timeout_s: int = Field(
        default=1800, ge=1, le=86_400, description="Ceiling on one command's wall clock (s)."
    )

    @field_validator("images")
    @classmethod
    def _check_images(cls, value: str) -> str:
        names = [name.strip() for name in value.split(",") if name.strip()]
        if not names or not all(
            re.fullmatch(r"[a-z0-9][a-z0-9._/-]*(:[\w.-]+)?", n) for n in names
        ):
            raise ValueError("must be a comma-separated list of image names such as repo/name:tag")
        return ",".join(names)

    @field_validator("sandbox_user")
    @classmethod
    def _check_sandbox_user(cls, value: str) -> str:
        match = re.fullmatch(r"(\d+):(\d+)", value)
        if not match or int(match.group(1)) == 0:
            raise ValueError("must be uid:gid of an unprivileged user, such as 1000:1000")
        return value

    @model_validator(mode="after")
    def _default_image_is_allowed(self) -> RuntimeSettings:
        if self.default_image not in self.image_list:
            raise ValueError(
                f"SANDBOX_MCP_DEFAULT_IMAGE={self.default_image!r} is not in SANDBOX_MCP_IMAGES"
            )
        return self

    @property
    def image_list(self) -> tuple[str, ...]:
        return tuple(self.images.split(","))

    @property
    def sandbox_ids(self) -> tuple[int, int]:
        """``sandbox_user`` as (uid, gid): parsed here once, validated above."""
        uid, gid = self.sandbox_user.split(":")
        return int(uid), int(gid)

    def container_cap(self, pool_size: int) -> int:
        """MAX_CONTAINERS, or twice the pool: every slot's first container plus as many
        again for second and third experiments (1,000 idle hardened ones take about 3.6 GB)."""
        return self.max_containers or 2 * pool_size

    def ceilings(self) -> Ceilings:
        """The most one experiment may get; the runtime clamps to it and the agent is told."""
        from app.runtime.limits import Ceilings  # the runtime's modules only when serving

        return Ceilings(
            cpus=self.max_cpus,
            memory_mb=self.max_memory_mb,
            pids=self.max_pids,
            timeout_s=self.max_command_timeout_s,
        )
