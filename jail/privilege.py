"""Whether this process may hand files to another user (root, or ``CAP_CHOWN``).

The server's image runs as an unprivileged uid whose Python binary carries the
file capabilities ``cap_chown,cap_dac_override,cap_fowner`` (Dockerfile), so
that sandboxes can run under a uid of their own, which owns nothing of the
server's, while the server still creates, reads, writes and deletes their
files. Code that would chown as root asks this instead of ``geteuid() == 0``.
"""

from __future__ import annotations

import functools
import os

CAP_CHOWN = 0


@functools.cache
def can_chown() -> bool:
    if os.geteuid() == 0:
        return True
    return bool(_effective_capabilities() >> CAP_CHOWN & 1)


def _effective_capabilities() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0
