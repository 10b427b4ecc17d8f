"""Snapshot copy: no secret and no outside content in the copy, the host tree
untouched (content, modes, mtimes and atimes), dangerous sources refused."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _jail_testkit import tree_state

from jail import JailError, snapshot, snapshot_copy
from jail._copier import Copier
from jail._snapshot_rules import SnapshotFilter, is_secret


@pytest.fixture(autouse=True, params=[1, 2], ids=["one-walk", "two-threads"])
def copy_workers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Every promise here holds for one walk and for the threaded copy workspaces use."""
    monkeypatch.setattr(snapshot, "DEFAULT_WORKERS", request.param)
    return int(request.param)


SECRET_MARK = b"SECRET-MATERIAL-d41d8c"
OUTSIDE_MARK = b"OUTSIDE-PROJECT-CONTENT-0b1e"

SECRET_FILES = [
    ".env",
    ".env.local",
    ".env.production",
    ".env.example",
    ".ENV",
    "prod.env",
    ".envrc",
    "server.pem",
    "Server.PEM",
    "tls.key",
    "cert.p12",
    "cert.pfx",
    "keystore.jks",
    "app.keystore",
    "putty.ppk",
    "vault.kdbx",
    "id_rsa",
    "id_rsa.pub",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    "id_ed25519.pub",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".git-credentials",
    ".pypirc",
    ".htpasswd",
    ".dockercfg",
    ".vault-token",
    ".boto",
    ".s3cfg",
    "credentials",
    "credentials.json",
    "gcp-credentials.json",
    "client_secret_123.json",
    "service-account-prod.json",
    "secrets.yml",
    "secrets.yaml",
    "secrets.json",
    "secrets.toml",
    "terraform.tfstate",
    "terraform.tfstate.backup",
    ".ssh/config",
    ".ssh/known_hosts",
    ".aws/credentials",
    ".aws/config",
    ".gnupg/pubring.kbx",
    ".kube/config",
    ".azure/accessTokens.json",
    ".password-store/site.gpg",
    ".gcloud/creds",
    ".docker/config.json",
    ".config/gcloud/credentials.db",
    ".config/gh/hosts.yml",
    ".git/config",
    ".hg/hgrc",
]
NORMAL_FILES = {
    "README.md": b"# project\n",
    ".npmrc": b"registry=https://registry.npmjs.org/\n",
    ".gitignore": b"dist/\n",
    "package.json": b"{}\n",
    "src/app.py": b"print('hi')\n",
    "src/pkg/mod.py": b"X = 1\n",
    "docs/guide.md": b"guide\n",
    "bin/run.sh": b"#!/bin/sh\n",
    "empty.txt": b"",
    ".docker/notes.txt": b"not the config\n",
    "env.py": b"ENV = 'dev'\n",
    "keyboard.py": b"keys\n",
    "tokenizer.json": b"{}\n",
    ".git/HEAD": b"ref: refs/heads/main\n",
}
BUILD_FILES = [
    "node_modules/pkg/index.js",
    "dist/bundle.js",
    "target/debug/app",
    ".venv/bin/python",
    "__pycache__/x.cpython-311.pyc",
    "src/__pycache__/mod.cpython-311.pyc",
    "build/out.o",
    ".pytest_cache/v/cache",
    "foo.egg-info/PKG-INFO",
    "stray.pyc",
]
LINKS = {
    "outside_abs": "{outside}/secret.txt",
    "outside_rel": "../outside/secret.txt",
    "outside_dir": "../outside",
    "nested/escape": "../../outside",
    "to_passwd": "/etc/passwd",
    "inside_link": "src/app.py",
    "nested/up_link": "../README.md",
    "dangling_inside": "missing.txt",
}
COPIED_LINKS = {"inside_link", "nested/up_link", "dangling_inside"}


def _write(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    _write(outside / "secret.txt", OUTSIDE_MARK)
    root = tmp_path / "project"
    for rel in SECRET_FILES:
        for prefix in ("", "nested/deeper/", "node_modules/pkg/"):
            _write(root / prefix / rel, SECRET_MARK)
    for rel, content in NORMAL_FILES.items():
        _write(root / rel, content)
    (root / "bin" / "run.sh").chmod(0o755)
    for rel in BUILD_FILES:
        _write(root / rel, b"built")
    for rel, target in LINKS.items():
        os.symlink(target.format(outside=outside), root / rel)
    os.symlink("README.md", root / "nested" / ".env")  # a secret name, even as a link
    os.mkfifo(root / "pipe")
    return root


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    made = tmp_path / "slot" / "workspace"
    made.mkdir(parents=True)
    return made


def _all_files(top: Path) -> dict[str, bytes]:
    found = {}
    for dirpath, _, filenames in os.walk(top):
        for name in filenames:
            path = Path(dirpath, name)
            if not path.is_symlink():
                found[str(path.relative_to(top))] = path.read_bytes()
    return found


@pytest.mark.timeout(30)
def test_copy_holds_no_secret_and_leaves_the_host_untouched(project: Path, dest: Path) -> None:
    before = tree_state(project)
    report = snapshot_copy(project, dest, home=project.parent / "home")
    assert tree_state(project) == before  # content, modes, mtimes, atimes (O_NOATIME)

    copied = _all_files(dest)
    assert not [p for p, data in copied.items() if SECRET_MARK in data or OUTSIDE_MARK in data]
    for rel in SECRET_FILES:
        assert not os.path.lexists(dest / rel), rel
        assert not os.path.lexists(dest / "nested" / "deeper" / rel), rel
    assert not os.path.lexists(dest / "nested" / ".env")
    for rel, content in NORMAL_FILES.items():
        assert copied[rel] == content, rel
        src, dst = (project / rel).stat(), (dest / rel).stat()
        assert (dst.st_mode, dst.st_mtime_ns) == (src.st_mode, src.st_mtime_ns), rel
    assert (dest / ".npmrc").read_bytes() == NORMAL_FILES[".npmrc"]
    for rel in BUILD_FILES:
        assert not os.path.lexists(dest / rel), rel
    assert not (dest / "pipe").exists()

    for rel in LINKS:
        if rel in COPIED_LINKS:
            assert os.readlink(dest / rel) == LINKS[rel]
        else:
            assert not os.path.lexists(dest / rel), rel

    assert report.files_copied == len(NORMAL_FILES)
    assert report.bytes_copied == sum(len(c) for c in NORMAL_FILES.values())
    assert report.links_copied == len(COPIED_LINKS)
    assert report.links_skipped == len(LINKS) - len(COPIED_LINKS)
    assert report.special_skipped == 1
    assert report.build_skipped > 0
    assert ".env" in report.secret_paths
    assert "nested/deeper/.ssh" in report.secret_paths
    assert all(not p.startswith("/") for p in report.secret_paths)


def test_build_output_can_be_included_but_never_its_secrets(project: Path, dest: Path) -> None:
    snapshot_copy(project, dest, include_build_output=True, home=project.parent / "home")
    for rel in BUILD_FILES:
        assert (dest / rel).read_bytes() == b"built", rel
    assert not (dest / "node_modules" / "pkg" / ".env").exists()
    assert not [p for p, data in _all_files(dest).items() if SECRET_MARK in data]


def test_extra_excludes(project: Path, dest: Path) -> None:
    report = snapshot_copy(
        project, dest, extra_excludes=["*.md", "src/pkg/*", "bin/"], home=project.parent / "x"
    )
    assert not (dest / "README.md").exists()
    assert not (dest / "docs" / "guide.md").exists()
    assert not (dest / "src" / "pkg" / "mod.py").exists()
    assert not (dest / "bin").exists()
    assert (dest / "src" / "app.py").exists()
    assert report.excluded_skipped == 4


def test_destination_inside_the_project_is_not_copied_into_itself(project: Path) -> None:
    inner = project / "sandbox-copy"
    inner.mkdir()
    report = snapshot_copy(project, inner, home=project.parent / "home")
    assert not (inner / "sandbox-copy").exists()
    assert report.files_copied == len(NORMAL_FILES)


@pytest.mark.parametrize(
    "make_source",
    [
        lambda home: home,
        lambda home: home.parent,
        lambda home: Path("/"),
        lambda home: Path("/proc/self"),
        lambda home: home / "work" / ".ssh",
        lambda home: home / "work" / ".." / "..",
        # A NUL byte: the resolve raised ValueError, a crash with a traceback (the hostile
        # input test met it when its project_path "a\x00b" came in under the limit).
        lambda home: Path("a\x00b"),
    ],
    ids=["home", "above-home", "root", "proc", "ssh-folder", "dotdot-to-home-parent", "nul"],
)
def test_dangerous_sources_are_refused(
    tmp_path: Path, dest: Path, make_source: Callable[[Path], Path]
) -> None:
    home = tmp_path / "home"
    (home / "work" / ".ssh").mkdir(parents=True)
    with pytest.raises(JailError) as excinfo:
        snapshot_copy(make_source(home), dest, home=home)
    assert excinfo.value.code == "PROJECT_PATH_REFUSED"
    assert str(tmp_path) not in excinfo.value.message
    assert os.listdir(dest) == []


def test_a_link_cannot_launder_the_home_folder(tmp_path: Path, dest: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "innocent").symlink_to(home)
    with pytest.raises(JailError) as excinfo:
        snapshot_copy(tmp_path / "innocent", dest, home=home)
    assert excinfo.value.code == "PROJECT_PATH_REFUSED"


def test_default_home_comes_from_the_account(
    tmp_path: Path, dest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_home = tmp_path / "fake-home"
    fake_home.mkdir()
    monkeypatch.setenv("HOME", str(fake_home))
    with pytest.raises(JailError) as excinfo:
        snapshot_copy(fake_home, dest)
    assert excinfo.value.code == "PROJECT_PATH_REFUSED"


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("missing-source", "NOT_FOUND"),
        ("file-source", "NOT_A_DIRECTORY"),
        ("missing-dest", "NOT_FOUND"),
        ("full-dest", "DIRECTORY_NOT_EMPTY"),
        ("bad-pattern", "INVALID_EXCLUDE_PATTERN"),
    ],
)
def test_refusals(project: Path, dest: Path, case: str, code: str) -> None:
    source, target, excludes = project, dest, ["*.log"]
    if case == "missing-source":
        source = project / "nope"
    elif case == "file-source":
        source = project / "README.md"
    elif case == "missing-dest":
        target = dest / "nope"
    elif case == "full-dest":
        (dest / "x").write_bytes(b"")
    else:
        excludes = ["ok", "bad\x00"]
    with pytest.raises(JailError) as excinfo:
        snapshot_copy(source, target, extra_excludes=excludes, home=project.parent / "home")
    assert excinfo.value.code == code


@pytest.mark.parametrize(
    ("path", "secret"),
    [
        (".env", True),
        ("a/.env.test", True),
        ("deploy/prod.env", True),
        ("keys/site.KEY", True),
        ("home/.docker/config.json", True),
        (".docker/config.json", True),
        ("docker/config.json", False),
        (".npmrc", False),
        ("env.py", False),
        ("environment.yml", False),
        ("keyboard.py", False),
        ("tokenizer.json", False),
        ("id_rsa_test_fixture.txt", True),
        ("credentials.py", False),
    ],
)
def test_secret_names(path: str, secret: bool) -> None:
    assert is_secret(path, is_dir=False) is secret


def test_secret_wins_over_everything() -> None:
    rules = SnapshotFilter(["*.py"], include_build_output=True)
    assert rules.classify(".env", is_dir=False) == "secret"
    assert rules.classify(".ssh", is_dir=True) == "secret"
    assert rules.classify("a.py", is_dir=False) == "excluded"
    assert rules.classify("node_modules", is_dir=True) == "copy"
    assert SnapshotFilter().classify("node_modules", is_dir=True) == "build"
    assert SnapshotFilter().classify("dist", is_dir=False) == "copy"  # a file named dist


def test_a_sparse_file_stays_sparse(tmp_path: Path) -> None:
    """2 GB of nothing around two small pieces of data copies as the pieces, not 2 GB."""
    project, dest = tmp_path / "project", tmp_path / "copy"
    project.mkdir()
    dest.mkdir()
    with (project / "sparse.bin").open("wb") as out:
        out.write(b"start")
        out.seek(1 << 30)
        out.write(b"middle")
        out.truncate(2 << 30)  # and a trailing hole
    report = snapshot_copy(project, dest, home=tmp_path / "home")
    copied = dest / "sparse.bin"
    assert copied.stat().st_size == 2 << 30
    assert copied.stat().st_blocks * 512 < 1 << 20  # it holds kilobytes, not gigabytes
    assert report.bytes_copied < 1 << 20
    with copied.open("rb") as data:
        assert data.read(5) == b"start"
        data.seek(1 << 30)
        assert data.read(6) == b"middle"
        data.seek((2 << 30) - 4)
        assert data.read() == b"\0" * 4


def _without_atimes(state: dict[str, tuple[object, ...]]) -> dict[str, tuple[object, ...]]:
    return {rel: entry[:4] if entry[0] == "file" else entry for rel, entry in state.items()}


@pytest.mark.timeout(30)
def test_a_mirror_gets_the_very_same_copy_in_the_same_walk(project: Path, dest: Path) -> None:
    """An experiment's workspace and baseline come from one read of the project."""
    mirror = dest.parent / "baseline"
    mirror.mkdir()
    before = tree_state(project)
    report = snapshot_copy(project, dest, home=project.parent / "home", mirror=mirror)
    assert tree_state(project) == before
    copied = tree_state(dest)
    assert _without_atimes(tree_state(mirror)) == _without_atimes(copied)
    assert report.files_copied == len(NORMAL_FILES)  # counted once, not per destination
    assert not [p for p, data in _all_files(mirror).items() if SECRET_MARK in data]
    # Two separate copies: changing one (as a container does) leaves the other alone.
    (dest / next(iter(NORMAL_FILES))).write_bytes(b"changed by the container")
    assert _without_atimes(tree_state(mirror)) != _without_atimes(tree_state(dest))
    assert (mirror / next(iter(NORMAL_FILES))).read_bytes() == NORMAL_FILES[
        next(iter(NORMAL_FILES))
    ]


def test_a_mirror_must_be_empty(project: Path, dest: Path) -> None:
    mirror = dest.parent / "baseline"
    mirror.mkdir()
    (mirror / "left").write_text("x")
    with pytest.raises(JailError) as caught:
        snapshot_copy(project, dest, home=project.parent / "home", mirror=mirror)
    assert caught.value.code == "DIRECTORY_NOT_EMPTY"


def test_a_small_file_keeps_its_size_with_a_trailing_hole_and_an_empty_one_stays_empty(
    tmp_path: Path,
) -> None:
    """Small files are copied whole (no hole search); their size still comes across."""
    project, dest = tmp_path / "project", tmp_path / "copy"
    project.mkdir()
    dest.mkdir()
    with (project / "tail.bin").open("wb") as out:
        out.write(b"head")
        out.truncate(10_000)  # a trailing hole well under SMALL_FILE
    (project / "empty.txt").write_bytes(b"")
    (project / "exact.txt").write_bytes(b"x" * 4096)
    snapshot_copy(project, dest, home=tmp_path / "home")
    assert (dest / "tail.bin").read_bytes() == b"head" + b"\0" * 9_996
    assert (dest / "empty.txt").read_bytes() == b""
    assert (dest / "exact.txt").read_bytes() == b"x" * 4096


def test_the_owner_is_given_to_the_first_copy_only(project: Path, dest: Path) -> None:
    """The workspace becomes the sandbox user's in the copying walk; the baseline stays ours."""
    if os.geteuid() != 0:
        pytest.fail("giving files away takes root: run the tests as root (CI does)")
    mirror = dest.parent / "baseline"
    mirror.mkdir()
    snapshot_copy(project, dest, home=project.parent / "home", mirror=mirror, owner=(4321, 4322))
    given = [dest, *dest.rglob("*")]
    assert len(given) > len(NORMAL_FILES)
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in given} == {(4321, 4322)}
    kept = [mirror, *mirror.rglob("*")]
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in kept} == {(0, 0)}
    assert any(p.is_symlink() for p in given)  # links were given away too (lchown)


def test_a_folder_swapped_for_a_link_out_before_its_thread_starts_is_not_followed(
    project: Path, dest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The threaded copy lists the top level, then hands each folder to a thread: a folder
    replaced meanwhile by a link out of the project is left out, never entered."""
    outside = project.parent / "outside"
    fork = Copier._fork

    def swapped_first(self: Copier, src_fd: int, dsts: tuple[int, ...], entry: Any, *a: Any) -> Any:
        if entry.name == "nested":
            os.rename(project / "nested", project.parent / "nested-aside")
            os.symlink(outside, project / "nested")
        return fork(self, src_fd, dsts, entry, *a)

    monkeypatch.setattr(Copier, "_fork", swapped_first)
    snapshot_copy(project, dest, home=project.parent / "home", workers=2)
    assert not (dest / "nested").exists()
    assert not [p for p, data in _all_files(dest).items() if OUTSIDE_MARK in data]
    assert (dest / "README.md").exists()  # the rest was copied
