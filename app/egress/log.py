"""Squid's access log as the meter reads it (blocking; the caller holds the folder's
lock and runs these in a thread): the lines since an offset, and the rotation.

The log is in /run (memory on most hosts), so it must not pile up: once the counted
part is past the meter's ``rotate_bytes`` it is moved aside and Squid is told to
reopen its own (SIGUSR1). ``meter.json`` keeps how far the old file was counted
(``aside``) until Squid has made the new one (it closes the old one first) or no
longer runs; the old file's last lines are counted with the new file's before it is
removed, so no line is lost or counted twice, also when the process that renamed it
died before it wrote ``meter.json`` (the next read finishes that rotation).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

import structlog

from app.egress import bounds as egress_bounds
from app.egress.bounds import Bounds
from app.egress.connlimit import take_refused
from app.egress.squid import SquidFolder
from app.egress.usage import Accounted, ProxyClient, account, account_limited, read_new_lines

log = structlog.get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class LogRead:
    done: Accounted
    end: int  # the log's offset after its whole lines
    aside_end: int | None  # the same in the log moved aside, if one is
    aside_complete: bool  # Squid writes no more into it: delete it once recorded
    limited: bool  # the connection limit refused someone


def read_since(
    folder: SquidFolder,
    offset: int,
    aside: int | None,
    clients: Mapping[str, ProxyClient],
    limit_list: str,
    proxy: tuple[str, int],
    bounds: tuple[str, Bounds] | None = None,
) -> LogRead:
    """Every new line to its experiment, the log moved aside first, and who the
    connection limits refused (``bounds``: the table of ``egress_bounds`` and its
    bounds)."""
    done = Accounted()
    aside_end, complete = None, False
    if aside is not None:
        # Squid made its new log (it closed the old one first) or no longer runs:
        # what the old one holds now is all it will ever hold. Asked before reading.
        complete = folder.access_log.exists() or folder.squid_pid() is None
        aside_end = _count(folder.rotated_log, aside, clients, done)
    end = _count(folder.access_log, offset, clients, done)
    limited = take_refused(limit_list) if limit_list else []
    account_limited(limited, clients, proxy, done)
    bounded = egress_bounds.take_refused(bounds[0]) if bounds else {}
    for scope, addresses in bounded.items():
        assert bounds is not None
        account_limited(
            addresses, clients, proxy, done, f"{scope}_connections", bounds[1].of(scope)
        )
    return LogRead(done, end, aside_end, complete, bool(limited or bounded))


def rotate(folder: SquidFolder, end: int, logged: dict[str, int]) -> None:
    """Move the counted log aside and have Squid start a new one. The meter's position
    says so before Squid is told: whatever Squid writes into the old file until it
    reopens is counted from ``end``."""
    pid = folder.squid_pid()
    if pid is None:
        return  # the next Squid's start empties it
    if folder.access_log.exists():
        folder.move_log_aside()
    elif not folder.rotated_log.exists():
        return
    # else a rotation cut short after the rename (its process died): ``end`` is
    # where that file was counted to, and it is finished now.
    folder.write_json(folder.meter, {"offset": 0, "aside": end, "logged": logged})
    folder.reopen_log(pid)
    log.info("egress.log_rotated", bytes=end)


def _count(path: Path, offset: int, clients: Mapping[str, ProxyClient], into: Accounted) -> int:
    """The whole lines of ``path`` from ``offset`` added into ``into``; the offset after
    them."""
    try:
        if offset > os.stat(path).st_size:
            offset = 0  # started afresh (a new Squid) after the offset was written
    except FileNotFoundError:
        return offset
    while True:
        lines, offset = read_new_lines(path, offset)
        if not lines:
            return offset
        account(lines, clients, into=into)
