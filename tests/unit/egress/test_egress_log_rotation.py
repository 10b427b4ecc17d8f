"""The proxy's access log is moved aside once counted past ``rotate_bytes``, and every
line is counted exactly once across the rotations: those Squid writes into the old
file until it reopens its own, those of the new file, those left when Squid stops.

Squid is faked as it behaves: it appends through a descriptor it keeps, so after the
rename its lines go on into the file moved aside until it is told to reopen the log
by name (SIGUSR1), which it does when the test says."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest
from egress_fakes import MemoryUsage

from app.egress import log as egress_log
from app.egress.connlimit import take_refused
from app.egress.meter import EgressMeter
from app.egress.records import Usage
from app.egress.squid import SquidFolder
from app.egress.usage import ProxyClient

ROTATE_BYTES = 16 * 1024
CLIENTS = [
    ProxyClient("c1", "172.30.0.2", ("pypi.org",), "exp_1"),
    ProxyClient("c2", "172.30.0.3", ("pypi.org",), "exp_2"),
]


class FakeSquid:
    """Appends log lines through one open descriptor, reopened by name when asked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: IO[str] = path.open("a", buffering=1)
        self.asked_to_reopen = 0
        self.running = True
        self.written = 0

    def write(self, count: int) -> None:
        for _ in range(count):
            self.written += 1
            port = 40000 + self.written % 20000
            if self.written % 4 == 0:
                line = (
                    f"1764590000.123 172.30.0.3 TCP_DENIED/403 3900 180 GET http://x.test/ {port}"
                )
            else:
                line = (
                    f"1764590000.123 172.30.0.2 TCP_TUNNEL/200 1000 200 CONNECT pypi.org:443 {port}"
                )
            self.file.write(line + "\n")

    def reopen(self) -> None:
        self.file.close()
        self.file = self.path.open("a", buffering=1)

    def stop(self) -> None:
        self.file.close()
        self.running = False


@dataclass(frozen=True)
class FakeSquidFolder(SquidFolder):
    squid: list[FakeSquid] = field(default_factory=list)  # the one running, if any

    def squid_pid(self) -> int | None:
        return 1 if self.squid and self.squid[0].running else None

    def reopen_log(self, squid_pid: int) -> None:
        self.squid[0].asked_to_reopen += 1  # done when the test says (Squid is slow)


def setup(root: Path) -> tuple[EgressMeter, FakeSquid, MemoryUsage]:
    folder = FakeSquidFolder(root)
    (root / "log").mkdir(parents=True)
    squid = FakeSquid(folder.access_log)
    folder.squid.append(squid)
    usage = MemoryUsage()
    meter = EgressMeter(
        folder, usage, max_bytes=10**12, scan=lambda: list(CLIENTS), rotate_bytes=ROTATE_BYTES
    )
    meter.proxy = ("172.30.0.1", 3128)
    return meter, squid, usage


def expected(written: int) -> dict[str, Usage]:
    denied = written // 4
    return {
        "exp_1": Usage((written - denied) * 1200, False, 0),
        "exp_2": Usage(denied * 4080, False, denied),
    }


def log_bytes(folder: SquidFolder) -> int:
    return sum(p.stat().st_size for p in (folder.access_log, folder.rotated_log) if p.exists())


async def test_no_line_is_lost_or_counted_twice_across_rotations(tmp_path: Path) -> None:
    meter, squid, usage = setup(tmp_path)
    await meter.refresh_state()
    largest = 0
    for round_ in range(120):
        squid.write(37 + round_ % 11)
        await meter.read_log()
        # Squid writes on into the file moved aside before (some rounds) it reopens.
        squid.write(round_ % 5)
        if squid.asked_to_reopen and round_ % 3:
            squid.asked_to_reopen = 0
            squid.reopen()
        squid.write(round_ % 7)
        largest = max(largest, log_bytes(meter.folder))
    squid.reopen()
    await meter.read_log()
    await meter.read_log()
    assert await usage.load(["exp_1", "exp_2"]) == expected(squid.written)
    rotations = squid.written * 82 // ROTATE_BYTES
    assert rotations > 10, "the log was rotated again and again"
    assert largest < 3 * ROTATE_BYTES, f"the log never held much more ({largest:,} bytes)"
    assert not meter.folder.rotated_log.exists()  # the old one removed once counted
    squid.stop()


async def test_a_squid_that_stops_before_it_reopens_has_its_last_lines_counted(
    tmp_path: Path,
) -> None:
    meter, squid, usage = setup(tmp_path)
    await meter.refresh_state()
    squid.write(400)  # about 32 KB: past ROTATE_BYTES
    await meter.read_log()
    assert meter.folder.rotated_log.exists()
    assert not meter.folder.access_log.exists()  # Squid has not reopened yet
    squid.write(25)  # into the file moved aside
    await meter.read_log()
    squid.stop()  # it never reopens: what the old file holds is all there is
    await meter.restart_log()  # as a new Squid's start does
    assert await usage.load(["exp_1", "exp_2"]) == expected(425)
    assert not meter.folder.rotated_log.exists()
    assert meter.folder.read_json(meter.folder.meter) == {"offset": 0, "logged": {}}


async def test_a_rotation_cut_short_after_the_rename_is_finished(tmp_path: Path) -> None:
    meter, squid, usage = setup(tmp_path)
    await meter.refresh_state()
    meter.rotate_bytes = 10**9
    squid.write(400)
    await meter.read_log()  # counted, not rotated
    meter.folder.move_log_aside()  # the process renamed it, then died
    squid.write(30)  # Squid writes on into the old file
    meter.rotate_bytes = ROTATE_BYTES
    await meter.read_log()  # finishes the rotation: Squid told to reopen
    assert squid.asked_to_reopen == 1
    squid.write(5)
    squid.reopen()
    squid.write(7)
    await meter.read_log()
    await meter.read_log()
    assert await usage.load(["exp_1", "exp_2"]) == expected(442)
    assert not meter.folder.rotated_log.exists()
    squid.stop()


async def test_a_log_under_the_threshold_is_left_alone(tmp_path: Path) -> None:
    meter, squid, usage = setup(tmp_path)
    await meter.refresh_state()
    squid.write(100)  # about 8 KB
    await meter.read_log()
    assert squid.asked_to_reopen == 0
    assert not meter.folder.rotated_log.exists()
    assert await usage.load(["exp_1", "exp_2"]) == expected(100)
    squid.stop()


async def test_the_connection_limits_refusals_become_notices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meter, squid, usage = setup(tmp_path)
    squid.stop()
    meter.limit_list = "SMCP-EGRESS-test"
    await meter.refresh_state()
    recent = tmp_path / "xt_recent"
    recent.mkdir()
    (recent / "SMCP-EGRESS-test").write_text(
        "src=172.30.0.2 ttl: 64 last_seen: 4295 oldest_pkt: 3 4295, 4295, 4295\n"
    )
    monkeypatch.setattr(egress_log, "take_refused", lambda name: take_refused(name, recent))
    await meter.read_log()
    assert (await usage.load(["exp_1"]))["exp_1"].refused == 1
    notices = await usage.take_notices("c1")
    assert len(notices) == 1
    assert "per-experiment connection limit was reached (64 connections" in notices[0].text
    assert (recent / "SMCP-EGRESS-test").read_text() == "-172.30.0.2\n"  # emptied of it
