"""Squid's external ACL helper for network "restricted": may this client reach this name?

Squid runs it (``external_acl_type``, as its own user, with the system Python: the
file is copied beside Squid's configuration, so it imports nothing of ours) and writes
one ``<client address> <host>`` line per request; it answers ``OK`` or ``ERR``. The
answer comes from the state file the server rewrites (atomically) whenever an
experiment's container starts or stops or reaches its byte cap: for each container
address, its allow-list and whether it is blocked. An address not in the file is
refused (a container of no live experiment). The file is read again only when it
changes.
"""

from __future__ import annotations

import json
import os
import sys


def allowed(state: dict[str, dict[str, object]], client: str, host: str) -> bool:
    entry = state.get(client)
    if not entry or entry.get("blocked"):
        return False
    name = host.lower().rstrip(".")
    names = entry.get("allow")
    for item in names if isinstance(names, list) else ():
        item = str(item)
        if item.startswith("."):
            if name == item[1:] or name.endswith(item):
                return True
        elif name == item:
            return True
    return False


def main(path: str) -> None:
    state: dict[str, dict[str, object]] = {}
    seen: tuple[int, int] | None = None
    for line in sys.stdin:
        try:
            info = os.stat(path)
            stamp = (info.st_mtime_ns, info.st_ino)
            if stamp != seen:
                with open(path, encoding="utf-8") as file:
                    state = json.load(file)
                seen = stamp
        except (OSError, ValueError):
            state, seen = {}, None  # refuse everything rather than guess
        parts = line.split()
        ok = len(parts) >= 2 and allowed(state, parts[0], parts[1])
        sys.stdout.write("OK\n" if ok else "ERR\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
