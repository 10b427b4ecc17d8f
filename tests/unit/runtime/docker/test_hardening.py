"""The engine and mount checks of app.runtime.docker.hardening."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from app.runtime.docker.hardening import seccomp_problem


def test_seccomp_default_or_custom_profile_is_fine() -> None:
    assert seccomp_problem({"SecurityOptions": ["name=seccomp,profile=default"]}) is None
    assert seccomp_problem({"SecurityOptions": ["name=seccomp,profile=/etc/strict.json"]}) is None


def test_seccomp_absent_or_unconfined_is_a_problem() -> None:
    for options in (
        None,
        [],
        ["name=apparmor", "name=userns"],
        ["name=seccomp,profile=unconfined"],
    ):
        problem = seccomp_problem({"SecurityOptions": options})
        assert problem is not None
        assert "seccomp" in problem


@pytest.mark.parametrize(
    ("options", "missing"),
    [
        ("nosuid,nodev", "[]"),
        ("nosuid", "['nodev']"),
        ("nodev", "['nosuid']"),
        ("rw", "['nosuid', 'nodev']"),
    ],
)
def test_mount_flags_are_read_from_the_filesystem(
    tmp_path: Path, options: str, missing: str
) -> None:
    # A tmpfs mounted with these options in a private mount namespace (needs root,
    # which the suite has), so the host's mounts are never touched.
    check = (
        "from pathlib import Path; from app.runtime.docker.hardening import missing_mount_flags; "
        f"print(missing_mount_flags(Path({str(tmp_path)!r})))"
    )
    script = (
        f"mount -t tmpfs -o {options} none {tmp_path} && {sys.executable} -c {shlex.quote(check)}"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).parents[4],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == missing
