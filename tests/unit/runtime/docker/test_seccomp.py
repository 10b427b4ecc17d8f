"""The syscall filter of dir-slot containers: Docker's default, allocating fallocate
refused, io_uring (which would step around it) absent. The kernel's side is proved
by tests/e2e/test_disk_budget_fallocate_over_http.py."""

from __future__ import annotations

import errno
import json
from typing import Any

import docker

from app.runtime.backend import Limits
from app.runtime.docker.hardening import hardened_host_config
from app.runtime.docker.seccomp import no_preallocation_profile


def rules_for(name: str) -> list[dict[str, Any]]:
    profile = json.loads(no_preallocation_profile())
    return [rule for rule in profile["syscalls"] if name in rule["names"]]


def test_fallocate_is_allowed_only_in_the_modes_that_free_blocks() -> None:
    rules = rules_for("fallocate")
    allowed = [r for r in rules if r["action"] == "SCMP_ACT_ALLOW"]
    refused = [r for r in rules if r["action"] == "SCMP_ACT_ERRNO"]
    assert all(r.get("args") for r in rules), "no unconditional fallocate rule"
    assert sorted(r["args"][0]["valueTwo"] for r in allowed) == [0x02, 0x08, 0x20]
    [refusal] = refused
    assert refusal["errnoRet"] == errno.EOPNOTSUPP  # glibc's posix_fallocate then writes
    assert refusal["args"][0] == {
        "index": 1,
        "value": 0x2A,
        "valueTwo": 0,
        "op": "SCMP_CMP_MASKED_EQ",
    }


def test_io_uring_is_not_allowed() -> None:
    for name in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
        assert not [r for r in rules_for(name) if r["action"] == "SCMP_ACT_ALLOW"], name


def test_only_dir_slot_containers_get_the_filter_and_the_file_size_limit() -> None:
    api = docker.APIClient(base_url="unix:///nonexistent", version="1.41")
    common: dict[str, Any] = {
        "mounts": [],
        "network_mode": "none",
        "limits": Limits(),
        "home": "/home/sandbox",
        "uid": 1000,
        "gid": 1000,
    }
    plain = hardened_host_config(api, **common)
    assert plain["SecurityOpt"] == ["no-new-privileges:true"]
    assert [u["Name"] for u in plain["Ulimits"]] == ["core"]
    dir_slot = hardened_host_config(api, **common, dir_budget_bytes=32 << 20)
    assert dir_slot["SecurityOpt"] == [
        "no-new-privileges:true",
        f"seccomp={no_preallocation_profile()}",
    ]
    assert {"Name": "fsize", "Soft": 32 << 20, "Hard": 32 << 20} in dir_slot["Ulimits"]
