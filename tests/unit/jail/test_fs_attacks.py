"""The attack corpus: every case is refused with the right code, and nothing
outside the sandbox is read, written, created or removed (``outside_unchanged``
compares content, mtimes and atimes of the canary and the sibling sandbox).
Each case runs under both resolvers (openat2 and the userspace walk)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from _jail_testkit import Layout
from timing import fastest

from jail import Jail, JailError

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("outside_unchanged")]

OUTSIDE = "PATH_OUTSIDE_SANDBOX"
ESCAPE = "SYMLINK_ESCAPE"
UNRESOLVABLE = "SYMLINK_UNRESOLVABLE"
SPECIAL = "NOT_A_REGULAR_FILE"
INVALID = "INVALID_PATH"

Op = Callable[[Jail, str], object]
OPS: dict[str, Op] = {
    "read": lambda j, p: j.read_bytes(p, max_bytes=1 << 20),
    "write": lambda j, p: j.write_bytes(p, b"PWNED"),
    "write_mk": lambda j, p: j.write_bytes(p, b"PWNED", make_parents=True),
    "stat": lambda j, p: j.stat(p),
    "stat_follow": lambda j, p: j.stat(p, follow_symlinks=True),
    "list": lambda j, p: j.list_dir(p),
    "walk": lambda j, p: list(j.walk(p, max_entries=1000)),
    "mkdir": lambda j, p: j.make_dirs(p),
    "remove": lambda j, p: j.remove(p, recursive=True),
    "rename_from": lambda j, p: j.rename(p, "stolen", overwrite=True),
    "rename_to": lambda j, p: j.rename("own.txt", p, overwrite=True),
    "open_fd": lambda j, p: os.close(j.open_fd(p, os.O_RDONLY)),
    "open_fd_write": lambda j, p: os.close(j.open_fd(p, os.O_WRONLY | os.O_CREAT)),
}

DEEP_CHAIN = 50  # beyond the kernel's 40-link limit

# "{canary}" and "{root}" are replaced by absolute host paths.
LINKS = {
    # Absolute targets are refused even when they would name something inside
    # (RESOLVE_BENEATH semantics, not RESOLVE_IN_ROOT; see KernelResolver).
    "abs_inside": "{root}/own.txt",
    "abs_in_root_style": "/own.txt",
    "to_root": "/",
    "to_passwd": "/etc/passwd",
    "to_dev_zero": "/dev/zero",
    "to_dev_zero_rel": "../" * 16 + "dev/zero",
    "to_proc_root": "/proc/self/root",
    "to_proc_root_rel": "../" * 16 + "proc/self/root",
    "to_canary_abs": "{canary}/secret.txt",
    "to_canary_dir_abs": "{canary}",
    "to_canary_rel": "../canary/secret.txt",
    "to_canary_dir": "../canary",
    "to_canary_fifo": "../canary/fifo",
    "to_sibling": "../sibling/file.txt",
    "to_sibling_dir": "../sibling",
    "to_parent": "..",
    "chain1": "chain2",
    "chain2": "chain3",
    "chain3": "../canary/secret.txt",
    "sub/up": "../..",
    "sub/up_canary": "../../canary/secret.txt",
    "loop_a": "loop_b",
    "loop_b": "loop_a",
    "self": "self",
    "dangling": "missing.txt",
    "dangling_dir": "missing_dir/x.txt",
    "dangling_outside": "../canary/nope.txt",
    "to_fifo": "fifo",
    "ok_link": "own.txt",
}

CASES: list[tuple[str, str, str]] = [
    # Lexical escapes: refused before the kernel sees them.
    ("read", "../canary/secret.txt", OUTSIDE),
    ("read", "sub/../../canary/secret.txt", OUTSIDE),
    ("read", "../" * 20 + "etc/passwd", OUTSIDE),
    ("read", "/etc/passwd", OUTSIDE),
    ("read", "{canary}/secret.txt", OUTSIDE),
    ("stat", "//etc", OUTSIDE),
    ("write", "../canary/pwned.txt", OUTSIDE),
    ("write_mk", "sub/../../canary/new/pwned.txt", OUTSIDE),
    ("list", "..", OUTSIDE),
    ("walk", "./..", OUTSIDE),
    ("mkdir", "../canary/newdir", OUTSIDE),
    ("remove", "../canary/secret.txt", OUTSIDE),
    ("rename_from", "../canary/secret.txt", OUTSIDE),
    ("rename_to", "../canary/stolen.txt", OUTSIDE),
    ("open_fd", "../sibling/file.txt", OUTSIDE),
    # Malformed names.
    ("read", "own.txt\x00.png", INVALID),
    ("write", "a\x00b", INVALID),
    ("read", "", INVALID),
    ("read", "x" * 256, INVALID),
    ("write_mk", "a/" * 2048 + "f", INVALID),
    ("read", "bad\ud800surrogate", INVALID),
    # Links leading outside, in every spelling.
    ("read", "to_root/etc/passwd", ESCAPE),
    ("list", "to_root", ESCAPE),
    ("read", "to_passwd", ESCAPE),
    ("stat_follow", "to_passwd", ESCAPE),
    ("open_fd", "to_passwd", ESCAPE),
    ("read", "to_canary_abs", ESCAPE),
    ("write", "to_canary_abs", ESCAPE),
    ("read", "to_canary_dir_abs/secret.txt", ESCAPE),
    ("read", "to_canary_rel", ESCAPE),
    ("write", "to_canary_rel", ESCAPE),
    ("open_fd_write", "to_canary_rel", ESCAPE),
    ("read", "to_canary_dir/secret.txt", ESCAPE),
    ("read", "to_canary_dir/sub/deep.txt", ESCAPE),
    ("write", "to_canary_dir/pwned.txt", ESCAPE),
    ("write_mk", "to_canary_dir/new/pwned.txt", ESCAPE),
    ("list", "to_canary_dir", ESCAPE),
    ("walk", "to_canary_dir", ESCAPE),
    ("mkdir", "to_canary_dir/newdir", ESCAPE),
    ("remove", "to_canary_dir/secret.txt", ESCAPE),
    ("remove", "to_canary_dir/sub", ESCAPE),
    ("rename_from", "to_canary_dir/secret.txt", ESCAPE),
    ("rename_to", "to_canary_dir/stolen.txt", ESCAPE),
    ("read", "to_sibling", ESCAPE),
    ("write", "to_sibling", ESCAPE),
    ("list", "to_sibling_dir", ESCAPE),
    ("write", "to_sibling_dir/planted.txt", ESCAPE),
    ("read", "to_parent/canary/secret.txt", ESCAPE),
    ("write", "to_parent", ESCAPE),
    ("read", "chain1", ESCAPE),
    ("write", "chain1", ESCAPE),
    ("read", "sub/up/canary/secret.txt", ESCAPE),
    ("list", "sub/up", ESCAPE),
    ("read", "sub/up_canary", ESCAPE),
    ("write", "sub/up_canary", ESCAPE),
    ("read", "dangling_outside", ESCAPE),
    ("write", "dangling_outside", ESCAPE),
    ("read", "to_canary_fifo", ESCAPE),
    ("read", "to_dev_zero", ESCAPE),
    ("read", "to_dev_zero_rel", ESCAPE),
    ("write", "to_dev_zero", ESCAPE),
    ("read", "to_proc_root/etc/passwd", ESCAPE),
    ("read", "to_proc_root_rel/etc/passwd", ESCAPE),
    ("list", "to_proc_root", ESCAPE),
    ("read", "abs_inside", ESCAPE),
    ("write", "abs_inside", ESCAPE),
    ("read", "abs_in_root_style", ESCAPE),
    ("write", "abs_in_root_style", ESCAPE),
    # Links that cannot be resolved.
    ("read", "loop_a", UNRESOLVABLE),
    ("write", "loop_a", UNRESOLVABLE),
    ("read", "self", UNRESOLVABLE),
    ("list", "self", UNRESOLVABLE),
    ("read", "deep_0", UNRESOLVABLE),
    ("write", "deep_0", UNRESOLVABLE),
    ("read", "dangling", UNRESOLVABLE),
    ("stat_follow", "dangling", UNRESOLVABLE),
    ("read", "dangling_dir", UNRESOLVABLE),
    ("write", "dangling_dir", UNRESOLVABLE),
    ("mkdir", "dangling/sub", UNRESOLVABLE),
    # Special files, refused without blocking.
    ("read", "fifo", SPECIAL),
    ("write", "fifo", SPECIAL),
    ("open_fd", "fifo", SPECIAL),
    ("open_fd_write", "fifo", SPECIAL),
    ("read", "to_fifo", SPECIAL),
    ("read", "zero", SPECIAL),
    ("write", "zero", SPECIAL),
    ("open_fd", "zero", SPECIAL),
    ("read", "sock", SPECIAL),
    ("write", "sock", SPECIAL),
]


@pytest.fixture
def hostile(layout: Layout) -> Layout:
    """A sandbox full of traps: links out, loops, dangling links, special files."""
    root = layout.root
    (root / "own.txt").write_bytes(b"own")
    (root / "sub").mkdir()
    for name, target in LINKS.items():
        os.symlink(target.format(canary=layout.canary, root=root), root / name)
    for n in range(DEEP_CHAIN):
        os.symlink(f"deep_{n + 1}" if n + 1 < DEEP_CHAIN else "own.txt", root / f"deep_{n}")
    os.mkfifo(root / "fifo")
    os.mknod(root / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))  # a /dev/zero twin
    # sun_path is short (108 bytes): bind in a short folder, then move the socket in.
    short = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(short / "s"))
        os.rename(short / "s", root / "sock")
    shutil.rmtree(short)
    return layout


def _case_id(case: tuple[str, str, str]) -> str:
    op, path, _ = case
    return f"{op}:{path[:40]!r}"


@pytest.mark.parametrize(("op", "path", "code"), CASES, ids=[_case_id(c) for c in CASES])
def test_attack_is_refused(jail: Jail, hostile: Layout, op: str, path: str, code: str) -> None:
    with pytest.raises(JailError) as excinfo:
        OPS[op](jail, path.format(canary=hostile.canary))
    err = excinfo.value
    assert err.code == code, err.message
    assert str(hostile.base) not in err.message + repr(err.details)
    # Refusals leave the sandbox alone too, bar the planted names.
    assert not (hostile.root / "stolen").exists()
    assert (hostile.root / "own.txt").read_bytes() == b"own"


LOOK_ALIKES = [
    "%2e%2e",
    "%2e%2e%2f",
    "..%2f",
    "\u2024\u2024",  # ONE DOT LEADER x2
    "\u2025",  # TWO DOT LEADER
    "\uff0e\uff0e",  # FULLWIDTH FULL STOP x2
    "\uff0e\uff0e\uff0fcanary\uff0f",  # ... with FULLWIDTH SOLIDUS
    "\u2215..\u2215",  # DIVISION SLASH
    "..\\..",
    "...",
    "....",
    " ..",
    ".. ",
    "..\u200b",
]


@pytest.mark.parametrize("name", LOOK_ALIKES)
def test_look_alikes_are_literal_names_inside(jail: Jail, layout: Layout, name: str) -> None:
    path = f"{name}/canary/secret.txt"
    with pytest.raises(JailError) as excinfo:
        jail.read_bytes(path, max_bytes=1 << 20)
    assert excinfo.value.code == "NOT_FOUND"
    jail.write_bytes(path, b"inside", make_parents=True)
    assert (layout.root / name / "canary" / "secret.txt").read_bytes() == b"inside"
    assert jail.read_bytes(path, max_bytes=100) == b"inside"


def test_escaping_links_are_described_but_not_followed(jail: Jail, hostile: Layout) -> None:
    info = jail.stat("to_canary_rel")
    assert (info.kind, info.link_target) == ("symlink", "../canary/secret.txt")
    listed = {i.path: i for i in jail.list_dir()}
    assert listed["to_canary_dir"].kind == "symlink"
    walked = [i.path for i in jail.walk(max_entries=10_000)]
    assert "to_canary_dir" in walked
    assert not [p for p in walked if p.startswith(("to_canary_dir/", "to_root/", "sub/up/"))]


@pytest.mark.parametrize("recursive", [False, True])
def test_remove_takes_the_link_not_its_target(jail: Jail, hostile: Layout, recursive: bool) -> None:
    jail.remove("to_canary_dir", recursive=recursive)
    jail.remove("to_canary_rel", recursive=recursive)
    assert not os.path.lexists(hostile.root / "to_canary_dir")
    assert (hostile.canary / "secret.txt").exists()


def test_rename_onto_or_of_a_link_moves_the_link(jail: Jail, hostile: Layout) -> None:
    jail.rename("to_canary_dir", "moved_link")
    assert os.readlink(hostile.root / "moved_link") == "../canary"
    jail.rename("own.txt", "to_canary_rel", overwrite=True)
    assert (hostile.root / "to_canary_rel").read_bytes() == b"own"  # the link was replaced


def test_inside_links_still_work_amid_traps(jail: Jail, hostile: Layout) -> None:
    assert jail.read_bytes("ok_link", max_bytes=100) == b"own"
    jail.write_bytes("ok_link", b"own")  # same content: the corpus checks it afterwards


def test_sparse_5gb_file_is_refused_fast_and_unread(jail: Jail, layout: Layout) -> None:
    huge = layout.root / "huge.bin"
    with open(huge, "wb") as f:
        f.truncate(5 * 1024**3)

    def refused() -> None:
        with pytest.raises(JailError) as excinfo:
            jail.read_bytes("huge.bin", max_bytes=1 << 20)
        assert excinfo.value.code == "TOO_LARGE"

    tracemalloc.start()
    try:
        refused()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    # The floor, measured here: reading a twentieth of the file, 1 MiB at a time (a
    # jail that read it through before refusing would take twenty times as long).
    buffer = bytearray(1 << 20)

    def read_a_twentieth() -> None:
        with open(huge, "rb", buffering=0) as f:
            for _ in range(256):
                f.readinto(buffer)

    assert fastest(refused, runs=3) < fastest(read_a_twentieth, runs=3)


def test_magic_links_are_refused(use_openat2: bool) -> None:
    # A root whose entries are procfs magic links (root, cwd, exe, fd/N).
    with Jail.open("/proc/self", use_openat2=use_openat2) as proc:
        for path in ("root/etc/passwd", "cwd", "root"):
            with pytest.raises(JailError) as excinfo:
                proc.read_bytes(path, max_bytes=1 << 20)
            # openat2's RESOLVE_NO_MAGICLINKS says ELOOP; the walk reads the
            # link text ("/") and refuses it as an absolute target.
            assert excinfo.value.code == (UNRESOLVABLE if use_openat2 else ESCAPE)
