"""The hardening every container of ours carries (app/runtime/docker/hardening.py), checked
in one place: on the parameters we send the engine, and on what the engine reports."""

from __future__ import annotations

from typing import Any

from app.runtime.docker.hardening import CAPABILITIES


def assert_hardened(host: dict[str, Any], *, pids: int, memory_mb: int) -> None:
    """``host`` is a HostConfig, sent (the SDK omits defaults) or inspected."""
    assert not host.get("Privileged")
    assert host["CapDrop"] == ["ALL"]
    assert sorted(host.get("CapAdd") or []) == sorted(CAPABILITIES) == []
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["Init"] is True
    assert host["PidsLimit"] == pids
    assert host["Memory"] == memory_mb * 1024 * 1024
    assert host["MemorySwap"] == host["Memory"], "no swap"
    assert host["NanoCpus"] == 1_000_000_000
    assert set(host["Tmpfs"]) == {"/tmp", "/home/sandbox"}
    assert not host.get("Binds")
    assert not host.get("Devices")
