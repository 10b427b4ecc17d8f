"""The pool of sandbox slots: how many, where they are stored, when an idle one is
emptied, and the byte budget of dir slots (which have no kernel quota)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from app.settings.base import Group


class PoolSettings(Group):
    size: int = Field(
        default=500, ge=1, le=10_000, alias="pool_size", description="Number of sandbox slots."
    )
    slot_backend: Literal["dir", "zfs"] = Field(
        default="dir", description="`dir` (folders in the state dir) or `zfs` (one dataset a slot)."
    )
    zfs_parent: str | None = Field(
        default=None,
        description="Dataset holding the slots (`POOL/DATASET`); required with the zfs backend.",
    )
    idle_timeout_s: int = Field(
        default=600,
        ge=10,
        le=86_400,
        description="Seconds of inactivity before a sandbox is emptied.",
    )
    accept_shared_disk: bool = Field(
        default=False,
        description=(
            "Serve anyone (oauth) on the dir backend although its slots have no quota and share "
            "a filesystem with the database, so one tenant could fill it: for trials only."
        ),
    )
    dir_slot_budget_mb: int = Field(
        default=1024,
        ge=16,
        le=10_000_000,
        description=(
            "Bytes (MB) a sandbox's dir slot and artifacts may allocate, measured after each "
            "writing call and every DISK_CHECK_INTERVAL_S; past it writing calls get "
            "QUOTA_EXCEEDED and the sandbox's commands are killed (a soft bound)."
        ),
    )
    dir_slot_max_entries: int = Field(
        default=200_000,
        ge=1000,
        le=10_000_000,
        description="Files and folders a dir slot may hold (bounds each walk, and inodes).",
    )
    disk_check_interval_s: float = Field(
        default=2.0,
        gt=0,
        le=600,
        description="Seconds between measurements of the dir slots that were written to.",
    )

    @field_validator("zfs_parent")
    @classmethod
    def _check_zfs_parent(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]*(/[A-Za-z0-9_.:-]+)+", value):
            raise ValueError("must name a dataset below a pool, such as tank/sandboxes")
        return value

    @model_validator(mode="after")
    def _zfs_needs_a_parent(self) -> PoolSettings:
        if self.slot_backend == "zfs" and self.zfs_parent is None:
            raise ValueError(
                "SANDBOX_MCP_SLOT_BACKEND='zfs' needs SANDBOX_MCP_ZFS_PARENT (the dataset that "
                "holds the slots, e.g. tank/sandboxes)"
            )
        return self

    @property
    def watchdog_interval_s(self) -> float:
        """How often the idle watchdog looks: a tenth of the idle timeout, at most 5 s."""
        return min(5.0, self.idle_timeout_s / 10)
