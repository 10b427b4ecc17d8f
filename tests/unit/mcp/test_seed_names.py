"""Seed 001's parameter values, translated to ours; conflicts and escapes refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.errors import InvalidArgument
from app.experiments.core.states import State
from app.mcp.tools import seed_names as seed
from jail import JailError


@pytest.mark.parametrize(
    ("given", "mb"),
    [
        ("1g", 1024),
        ("1G", 1024),
        ("2GB", 2048),
        ("512m", 512),
        ("512Mi", 512),
        ("512MiB", 512),
        ("2048k", 2),
        ("1.5g", 1536),
        (" 256m ", 256),
        ("1t", 1024 * 1024),
        ("1048576", 1),  # a plain string of digits is bytes
        (268_435_456, 256),  # so is a number
        (1, 1),  # rounded up to a whole megabyte (the runtime then applies its floor)
        ("1500k", 2),
        ("4096b", 1),
    ],
)
def test_memory_limits_in_the_seeds_forms(given: str | int, mb: int) -> None:
    assert seed.memory_mb(given) == mb


@pytest.mark.parametrize(
    "given",
    [
        "",
        "lots",
        "1 gigabyte",
        "1gg",
        "5i",
        "1bb",
        "-1g",
        "0",
        0,
        -5,
        "1e9",
        "NaN",
        "inf",
        "1x",
        True,
        "9" * 40,
    ],
)
def test_invalid_memory_limits_name_the_field_and_the_forms(given: str | int) -> None:
    with pytest.raises(InvalidArgument) as caught:
        seed.memory_mb(given)
    assert caught.value.details == {"field": "memory_limit"}
    assert "'512m', '1g'" in caught.value.message


def test_network_modes_map_to_ours() -> None:
    assert seed.network(None, None) == "none"
    assert seed.network(None, "none") == "none"
    assert seed.network(None, "enabled") == "egress"
    assert seed.network("egress", "enabled") == "egress"  # the same thing twice is fine
    assert seed.network("egress", None) == "egress"


def test_restricted_network_is_ours_too() -> None:
    assert seed.network(None, "restricted") == "restricted"
    assert seed.network("restricted", "restricted") == "restricted"
    with pytest.raises(InvalidArgument):
        seed.network("egress", "restricted")


def test_our_name_and_the_seeds_with_different_values_are_refused() -> None:
    with pytest.raises(InvalidArgument) as caught:
        seed.network("none", "enabled")
    assert "network and network_mode" in caught.value.message
    assert "keep one" in caught.value.message
    with pytest.raises(InvalidArgument) as caught:
        seed.pick(("goal", "a"), ("objective", "b"))
    assert caught.value.details == {"field": "objective"}
    assert seed.pick(("goal", "a"), ("objective", "a")) == "a"
    assert seed.pick(("goal", None), ("objective", "b")) == "b"
    assert seed.pick(("timeout_s", 60.0), ("timeout", 60)) == 60.0
    assert seed.pick(("cpus", None), ("cpu_limit", None)) is None


def test_only_copying_is_offered() -> None:
    seed.copy_only(None)
    seed.copy_only("COPY_TO_SANDBOX")
    with pytest.raises(seed.NotOffered) as caught:
        seed.copy_only("READ_ONLY_BIND_MOUNT")
    assert "COPY_TO_SANDBOX" in caught.value.message


def test_status_filter_is_case_insensitive_and_checked() -> None:
    assert seed.state_filter(None) is None
    assert seed.state_filter("running") is State.RUNNING
    assert seed.state_filter("Destroyed") is State.DESTROYED
    with pytest.raises(InvalidArgument) as caught:
        seed.state_filter("alive")
    assert "ready" in caught.value.message
    assert caught.value.details == {"field": "status"}


def test_labels_only_for_compared_experiments() -> None:
    seed.check_labels({"exp_a": "A"}, ["exp_a", "exp_b"])
    with pytest.raises(InvalidArgument):
        seed.check_labels({"exp_c": "C"}, ["exp_a", "exp_b"])


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "file.txt").write_text("x")
    (root / "inside").symlink_to("pkg")
    (root / "outside").symlink_to(tmp_path)
    return root


async def test_workdir_prefixes_a_quoted_cd(workspace: Path) -> None:
    assert await seed.in_workdir(asyncio.to_thread, workspace, None, "ls") == "ls"
    assert await seed.in_workdir(asyncio.to_thread, workspace, ".", "ls") == "ls"
    assert await seed.in_workdir(asyncio.to_thread, workspace, "pkg/./sub/", "ls") == (
        "cd -- /workspace/pkg/sub || exit 1\nls"
    )
    inside = await seed.in_workdir(asyncio.to_thread, workspace, "inside", "ls")
    assert inside.startswith("cd -- /workspace/inside")


async def test_workdir_with_shell_characters_is_quoted(workspace: Path) -> None:
    odd = "a b; $(touch x)'"
    (workspace / odd).mkdir()
    wrapped = await seed.in_workdir(asyncio.to_thread, workspace, odd, "ls")
    assert wrapped.startswith("cd -- '/workspace/a b; $(touch x)'\"'\"'' || exit 1\n")


@pytest.mark.parametrize(
    "escape", ["/etc", "..", "../..", "pkg/../../x", "outside", "a\x00b", "x" * 5000]
)
async def test_workdir_escapes_are_invalid_arguments(workspace: Path, escape: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        await seed.in_workdir(asyncio.to_thread, workspace, escape, "ls")
    assert caught.value.details["field"] == "workdir"
    assert "/workspace" in caught.value.message


async def test_workdir_must_be_an_existing_folder(workspace: Path) -> None:
    with pytest.raises(InvalidArgument):
        await seed.in_workdir(asyncio.to_thread, workspace, "file.txt", "ls")
    with pytest.raises(JailError) as caught:
        await seed.in_workdir(asyncio.to_thread, workspace, "missing", "ls")
    assert caught.value.code == "NOT_FOUND"
