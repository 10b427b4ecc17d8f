"""Which host folder may become /workspace: real folders inside one slot, nothing else."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.runtime.docker.workspace import check_workspace, refuse_docker_socket
from app.runtime.errors import WorkspaceRefused


@pytest.fixture
def base(tmp_path: Path) -> Path:
    slots = tmp_path / "slots"
    (slots / "slot-000" / "experiments" / "e1" / "workspace").mkdir(parents=True)
    (slots / "slot-001" / "secret").mkdir(parents=True)
    return slots


def refused(workspace: Path, base: Path) -> str:
    with pytest.raises(WorkspaceRefused) as caught:
        check_workspace(workspace, base)
    assert caught.value.code == "WORKSPACE_REFUSED"
    assert str(base) not in caught.value.message, "messages never hold host paths"
    return str(caught.value.details["reason"])


def test_a_real_folder_inside_a_slot_is_accepted(base: Path) -> None:
    workspace = base / "slot-000" / "experiments" / "e1" / "workspace"
    assert check_workspace(workspace, base) == workspace.resolve()


def test_a_slots_base_reached_through_a_link_is_fine(base: Path, tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(base)
    accepted = check_workspace(alias / "slot-000", alias)
    assert accepted == (base / "slot-000").resolve()


def test_relative_paths_are_refused(base: Path) -> None:
    assert refused(Path("slot-000"), base) == "not an absolute path"


def test_dot_dot_is_refused_even_when_it_stays_inside(base: Path) -> None:
    assert refused(base / "slot-000" / ".." / "slot-001", base) == "'..' in its path"


def test_a_folder_outside_the_slots_base_is_refused(base: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert refused(outside, base) == "outside the slots folder"
    assert refused(Path("/"), base) == "outside the slots folder"


def test_the_slots_base_itself_is_refused(base: Path) -> None:
    assert "slots folder itself" in refused(base, base)


def test_a_missing_folder_is_refused(base: Path) -> None:
    assert refused(base / "slot-000" / "nope", base) == "the folder does not exist"


def test_a_file_is_refused(base: Path) -> None:
    (base / "slot-000" / "file").write_text("x")
    assert refused(base / "slot-000" / "file", base) == "a path component is not a folder"


def test_a_link_as_the_workspace_is_refused(base: Path) -> None:
    link = base / "slot-000" / "experiments" / "e2"
    link.symlink_to(base / "slot-001" / "secret")
    assert refused(link, base) == "a symbolic link in its path"


def test_a_link_in_a_parent_folder_is_refused(base: Path) -> None:
    (base / "slot-000" / "sneaky").symlink_to(base / "slot-001")
    assert refused(base / "slot-000" / "sneaky" / "secret", base) == "a symbolic link in its path"


def test_a_link_inside_the_slot_pointing_within_the_slot_is_still_refused(base: Path) -> None:
    (base / "slot-000" / "same").symlink_to(base / "slot-000" / "experiments")
    assert refused(base / "slot-000" / "same" / "e1", base) == "a symbolic link in its path"


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    yield path
    server.close()


def test_the_docker_socket_is_never_a_mount_source(tmp_path: Path, unix_socket: Path) -> None:
    fake_run = tmp_path / "run"
    fake_run.mkdir()
    sock = fake_run / "docker.sock"
    sock.write_text("")
    with pytest.raises(WorkspaceRefused, match="Docker socket"):
        refuse_docker_socket([str(sock)], sockets=[])
    with pytest.raises(WorkspaceRefused, match="contains the Docker socket"):
        refuse_docker_socket([str(fake_run)], sockets=[str(sock)])
    with pytest.raises(WorkspaceRefused, match="contains the Docker socket"):
        refuse_docker_socket(["/"], sockets=[str(sock)])
    with pytest.raises(WorkspaceRefused, match="socket"):
        refuse_docker_socket([str(unix_socket)], sockets=[])


def test_an_ordinary_folder_passes_the_socket_check(base: Path) -> None:
    refuse_docker_socket([str(base / "slot-000")])
