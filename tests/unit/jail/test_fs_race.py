"""Race: a folder is swapped for a link to outside, as fast as the kernel allows,
while another thread reads and writes through it at least 10,000 times. Zero
escapes: the outside secret is never returned (nor read: its atime is checked),
and nothing outside is written or created.

The attempts go on until the race was real (at least 10,000 attempts, 1,000
swaps made meanwhile, both the folder and the link met), however slow the
machine: a busy one gives the swapper thread fewer turns, so a fixed number of
attempts proved nothing about it. Only a race that never became real within a
generous time, or an escape, fails the test."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from _jail_testkit import CANARY_SECRET, Layout

from jail import Jail, JailError
from jail._syscalls import RENAME_EXCHANGE, renameat2

MIN_ATTEMPTS = 10_000
MIN_SWAPS = 1_000
# Generous: an idle machine meets the counts in about a second.
RACE_DEADLINE_S = 200
INSIDE = b"inside"
EXPECTED_REFUSALS = {"SYMLINK_ESCAPE", "NOT_FOUND", "PATH_BUSY"}


class Swapper(threading.Thread):
    """Exchanges ``d`` (a real folder) and ``d_link`` (a link out) in a loop.

    renameat2(RENAME_EXCHANGE) swaps both names atomically, so at every
    instant ``d`` is either the folder or the link: the worst case for a
    check-then-open jail.
    """

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        self.stop = threading.Event()
        self.swaps = 0

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                renameat2(self.root_fd, b"d", self.root_fd, b"d_link", RENAME_EXCHANGE)
                self.swaps += 1
        finally:
            os.close(self.root_fd)


@pytest.mark.timeout(RACE_DEADLINE_S + 60)
@pytest.mark.usefixtures("outside_unchanged")
@pytest.mark.parametrize("link_target", ["..", "../sandbox/..", "{base}"])
def test_swapping_a_folder_for_a_link_never_escapes(
    jail: Jail, layout: Layout, link_target: str
) -> None:
    # Through the link, "d/canary/secret.txt" names the outside canary; through
    # the folder, a harmless twin.
    (layout.root / "d" / "canary").mkdir(parents=True)
    (layout.root / "d" / "canary" / "secret.txt").write_bytes(INSIDE)
    os.symlink(link_target.format(base=layout.base), layout.root / "d_link")

    outcomes: Counter[str] = Counter()
    swapper = Swapper(layout.root)
    deadline = time.monotonic() + RACE_DEADLINE_S
    swapper.start()
    try:
        n = 0
        while not _race_was_real(outcomes, n, swapper.swaps) and time.monotonic() < deadline:
            outcomes[_attempt(jail, n)] += 1
            n += 1
    finally:
        swapper.stop.set()
        swapper.join()

    assert outcomes["escaped"] == 0
    assert set(outcomes) <= {"ok", "refused"}, outcomes
    # The race was real: swaps went on meanwhile, and both the folder and the link were met.
    assert _race_was_real(outcomes, n, swapper.swaps), (
        f"in {RACE_DEADLINE_S} s: {n} attempts, {swapper.swaps} swaps, {dict(outcomes)}"
    )


def _race_was_real(outcomes: Counter[str], attempts: int, swaps: int) -> bool:
    return (
        attempts >= MIN_ATTEMPTS
        and swaps >= MIN_SWAPS
        and outcomes["ok"] > 0
        and outcomes["refused"] > 0
    )


def _attempt(jail: Jail, n: int) -> str:
    try:
        if n % 3 == 0:
            data = jail.read_bytes("d/canary/secret.txt", max_bytes=1 << 10)
            if data != INSIDE:
                return "escaped" if CANARY_SECRET in data else "garbled"
        elif n % 3 == 1:
            jail.write_bytes("d/canary/written.txt", b"w")
        else:
            names = {info.path for info in jail.list_dir("d/canary")}
            if names - {"d/canary/secret.txt", "d/canary/written.txt"}:
                return "escaped"
    except JailError as err:
        # Refused as an escape, or a name that vanished mid-swap; never anything else.
        return "refused" if err.code in EXPECTED_REFUSALS else f"unexpected {err.code}"
    return "ok"
