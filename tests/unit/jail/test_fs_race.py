"""Race: a folder is swapped for a link to outside, as fast as the kernel allows,
while another thread reads and writes through it 10,000 times. Zero escapes:
the outside secret is never returned (nor read: its atime is checked), and
nothing outside is written or created."""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

import pytest
from _jail_testkit import CANARY_SECRET, Layout

from jail import Jail, JailError
from jail._syscalls import RENAME_EXCHANGE, renameat2

ITERATIONS = 10_000
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


@pytest.mark.timeout(120)
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
    swapper.start()
    try:
        for n in range(ITERATIONS):
            outcomes[_attempt(jail, n)] += 1
    finally:
        swapper.stop.set()
        swapper.join()

    assert outcomes["escaped"] == 0
    assert set(outcomes) <= {"ok", "refused"}, outcomes
    # The race was real: both the folder and the link were met.
    assert swapper.swaps > 1000
    assert outcomes["ok"] > 0
    assert outcomes["refused"] > 0


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
