"""A container's host pids read from its cgroup folder (app/runtime/docker/cgroup_pids.py),
on fake ``/proc`` and cgroup trees of the three layouts the engine uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.runtime.docker.cgroup_pids import MAX_FOLDERS, CgroupPids

CID = "9c516fc5cd18f0b13796af45b689c748367d1fea4b31302634717c5ffacc76ed"


def fake_host(tmp: Path, cgroup_lines: list[str], folder: str, pids: list[int]) -> CgroupPids:
    proc, root = tmp / "proc", tmp / "cgroup"
    (proc / str(pids[0])).mkdir(parents=True)
    (proc / str(pids[0]) / "cgroup").write_text("\n".join(cgroup_lines) + "\n")
    (root / folder).mkdir(parents=True)
    (root / folder / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    return CgroupPids(proc, root)


@pytest.mark.parametrize(
    ("lines", "folder"),
    [
        ([f"0::/system.slice/docker-{CID}.scope"], f"system.slice/docker-{CID}.scope"),
        ([f"12:pids:/docker/{CID}", f"0::/docker/{CID}"], f"unified/docker/{CID}"),
        ([f"12:pids:/docker/{CID}", "3:cpu,cpuacct:/docker/x"], f"pids/docker/{CID}"),
    ],
    ids=["v2-systemd", "hybrid-unified", "v1-pids"],
)
def test_the_folder_is_learnt_from_the_first_process(
    tmp_path: Path, lines: list[str], folder: str
) -> None:
    cgroups = fake_host(tmp_path, lines, folder, [4100, 4200, 4300])
    assert cgroups.pids(CID) is None  # not learnt yet
    cgroups.learn(CID, 4100)
    assert cgroups.tried(CID)
    assert cgroups.pids(CID) == [4100, 4200, 4300]
    # Read afresh each time: a new process shows up at once.
    (tmp_path / "cgroup" / folder / "cgroup.procs").write_text("4100\n4200\n4300\n4400\n")
    assert cgroups.pids(CID) == [4100, 4200, 4300, 4400]


def test_folders_below_the_cgroup_are_read_too(tmp_path: Path) -> None:
    cgroups = fake_host(tmp_path, [f"0::/docker/{CID}"], f"docker/{CID}", [4100])
    below = tmp_path / "cgroup" / "docker" / CID / "inner"
    below.mkdir()
    (below / "cgroup.procs").write_text("4500\n")
    cgroups.learn(CID, 4100)
    assert sorted(cgroups.pids(CID) or []) == [4100, 4500]


def test_folders_below_are_read_up_to_the_bound(tmp_path: Path) -> None:
    cgroups = fake_host(tmp_path, [f"0::/docker/{CID}"], f"docker/{CID}", [4100])
    for i in range(MAX_FOLDERS + 10):
        below = tmp_path / "cgroup" / "docker" / CID / f"f{i}"
        below.mkdir()
        (below / "cgroup.procs").write_text("")
    cgroups.learn(CID, 4100)
    assert cgroups.pids(CID) is not None  # answered, however many folders there are


@pytest.mark.parametrize(
    "lines",
    [
        ["0::/"],  # a pid of another namespace: the server's own view, no container id
        ["0::/docker/someone-else"],
        [f"0::/docker/{CID}-not-this-folder"],
    ],
)
def test_a_cgroup_that_does_not_name_the_container_is_not_trusted(
    tmp_path: Path, lines: list[str]
) -> None:
    cgroups = fake_host(tmp_path, lines, f"docker/{CID}", [4100])
    cgroups.learn(CID, 4100)
    assert cgroups.tried(CID)
    assert cgroups.pids(CID) is None  # the caller asks the engine (docker top)


def test_an_invisible_pid_or_one_outside_the_folder_is_not_trusted(tmp_path: Path) -> None:
    cgroups = fake_host(tmp_path, [f"0::/docker/{CID}"], f"docker/{CID}", [4100, 4200])
    cgroups.learn(CID, 999)  # no /proc/999 here
    assert cgroups.pids(CID) is None
    (tmp_path / "proc" / "4300").mkdir()
    (tmp_path / "proc" / "4300" / "cgroup").write_text(f"0::/docker/{CID}\n")
    cgroups.learn(CID, 4300)  # names the folder, but the folder does not hold it
    assert cgroups.pids(CID) is None


def test_a_gone_cgroup_is_forgotten_and_learnt_again(tmp_path: Path) -> None:
    cgroups = fake_host(tmp_path, [f"0::/docker/{CID}"], f"docker/{CID}", [4100])
    cgroups.learn(CID, 4100)
    folder = tmp_path / "cgroup" / "docker" / CID
    (folder / "cgroup.procs").unlink()
    folder.rmdir()  # the container stopped or was removed
    assert cgroups.pids(CID) is None
    assert not cgroups.tried(CID)  # the engine is asked (and it may be learnt again)
