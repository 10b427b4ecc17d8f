"""Undoing the mounts a test's provisioning made."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pool.mount_flags import mount_points


def unmount_below(folder: Path) -> None:
    """Undo the mounts a test's provisioning made (``provision`` as root seals the slots
    with a bind mount): left mounted, pytest can never delete the folder."""
    prefix = f"{folder.resolve()}/"
    points = mount_points(Path("/proc/self/mountinfo").read_text())
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
