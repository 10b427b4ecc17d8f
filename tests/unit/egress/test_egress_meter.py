"""The egress meter: a big access log is read off the event loop, counted per
experiment once whichever process reads it, and stops the experiment that reaches
its cap; the ACL state is written whole from Docker's view and the recorded caps."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from egress_fakes import MemoryUsage

from app.egress import usage as egress_usage
from app.egress.meter import EgressMeter
from app.egress.records import Notice, Usage
from app.egress.squid import SquidFolder
from app.egress.usage import LogLine, ProxyClient
from app.errors import DatabaseUnavailable

LINES = 120_000  # about 9 MB: more than two reads of the log
CLIENTS = [
    ProxyClient("c1", "172.30.0.2", ("pypi.org",), "exp_1"),
    ProxyClient("c2", "172.30.0.3", ("pypi.org",), "exp_2"),
]


def meter_on(root: Path, usage: MemoryUsage, max_bytes: int = 10**12) -> EgressMeter:
    folder = SquidFolder(root)
    (root / "log").mkdir(parents=True, exist_ok=True)
    meter = EgressMeter(folder, usage, max_bytes=max_bytes, scan=lambda: list(CLIENTS))
    meter.proxy = ("172.30.0.1", 3128)
    return meter


def big_log(path: Path) -> None:
    tunnel = "1764590000.123 172.30.0.2 TCP_TUNNEL/200 1000 200 CONNECT pypi.org:443\n"
    denied = "1764590000.123 172.30.0.3 TCP_DENIED/403 3900 180 CONNECT evil.example:443\n"
    with path.open("w") as file:
        for i in range(LINES):
            file.write(denied if i % 10 == 0 else tunnel)


async def test_a_big_log_is_parsed_off_the_event_loop_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = MemoryUsage()
    meter = meter_on(tmp_path, usage)
    await meter.refresh_state()
    big_log(meter.folder.access_log)
    loop_thread = threading.get_ident()
    parsed_on: set[int] = set()
    parse = LogLine.parse

    def spying(line: str) -> LogLine | None:
        parsed_on.add(threading.get_ident())
        return parse(line)

    monkeypatch.setattr(egress_usage.LogLine, "parse", staticmethod(spying))
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    beating = asyncio.create_task(ticker())
    await meter.read_log()
    done.set()
    await beating
    assert parsed_on, "the log was parsed"
    assert loop_thread not in parsed_on, "never on the event loop's thread"
    assert ticks > 1, "the loop kept running meanwhile"
    recorded = await usage.load(["exp_1", "exp_2"])
    assert recorded["exp_1"].bytes == LINES * 9 // 10 * 1200  # every chunk, to the end
    assert recorded["exp_2"] == Usage(LINES // 10 * 4080, False, LINES // 10)
    notices = await usage.take_notices("c2")
    assert len(notices) == 20, "a bounded list waits for the next result"


async def test_two_processes_count_one_log_once(tmp_path: Path) -> None:
    # Two meters on one folder (two processes): each line is counted by one of them.
    usage = MemoryUsage()
    first, second = meter_on(tmp_path, usage), meter_on(tmp_path, usage)
    await first.refresh_state()
    log = first.folder.access_log
    with log.open("a") as file:
        file.write("1 172.30.0.2 TCP_TUNNEL/200 600 400 CONNECT pypi.org:443\n")
    await asyncio.gather(first.read_log(), second.read_log())
    with log.open("a") as file:
        file.write("1 172.30.0.2 TCP_DENIED/403 300 0 CONNECT evil.example:443\n")
    await second.read_log()
    await first.read_log()
    assert (await usage.load(["exp_1"]))["exp_1"] == Usage(1_300, False, 1)
    # The refusal reaches whichever process runs the experiment's next command, once.
    told = await first.take_notice("c1")
    assert told is not None
    assert "evil.example:443: not on this experiment's allow-list" in told
    assert await second.take_notice("c1") is None


async def test_the_log_reaching_the_cap_blocks_records_and_cuts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuts: list[str] = []
    monkeypatch.setattr(
        "app.egress.meter.cut", lambda gateway, port, client: cuts.append(client) or 1
    )
    usage = MemoryUsage()
    await usage.record({"exp_1": 5_000})  # moved before a restart, or through another process
    meter = meter_on(tmp_path, usage, max_bytes=10_000)
    await meter.refresh_state()
    assert meter.folder.read_state()["172.30.0.2"]["blocked"] is False
    meter.folder.access_log.write_text("1 172.30.0.2 TCP_TUNNEL/200 6000 0 CONNECT pypi.org:443\n")
    await meter.read_log()
    assert (await usage.load(["exp_1"]))["exp_1"].capped is True
    assert meter.folder.read_state()["172.30.0.2"] == {
        "allow": ["pypi.org"],
        "blocked": True,
        "container": "c1",
        "experiment": "exp_1",
        "sandbox": "",
        "signin": "",
    }
    assert meter.folder.read_state()["172.30.0.3"]["blocked"] is False
    assert cuts == ["172.30.0.2"]
    told = await meter.take_notice("c1")
    assert told is not None
    assert "EGRESS_CAP_REACHED" in told
    assert await meter.take_notice("c1") is None, "the cap is told once"
    # A state written afresh (another process's container came) keeps it blocked.
    await meter_on(tmp_path, usage, max_bytes=10_000).refresh_state()
    assert meter.folder.read_state()["172.30.0.2"]["blocked"] is True


class FailingOnce(MemoryUsage):
    def __init__(self) -> None:
        super().__init__()
        self.fail = True

    async def record(
        self,
        moved: Mapping[str, int],
        refused: Mapping[str, int] | None = None,
        notices: Sequence[Notice] = (),
        *,
        max_pending: int = 20,
        sandboxes: Mapping[str, int] | None = None,
    ) -> dict[str, Usage]:
        if self.fail:
            self.fail = False
            raise DatabaseUnavailable("the database is restarting")
        return await super().record(
            moved, refused, notices, max_pending=max_pending, sandboxes=sandboxes
        )


async def test_bytes_counted_while_the_database_is_down_are_recorded_later(
    tmp_path: Path,
) -> None:
    usage = FailingOnce()
    meter = meter_on(tmp_path, usage, max_bytes=10_000)
    await meter.refresh_state()
    log = meter.folder.access_log
    log.write_text("1 172.30.0.2 TCP_TUNNEL/200 6000 0 CONNECT pypi.org:443\n")
    await meter.read_log()  # the database refuses: nothing raised, nothing lost
    with log.open("a") as file:
        file.write("1 172.30.0.2 TCP_TUNNEL/200 1000 0 CONNECT pypi.org:443\n")
    await meter.read_log()
    assert (await usage.load(["exp_1"]))["exp_1"] == Usage(7_000, False)


async def test_a_new_squid_starts_a_fresh_log_after_the_last_lines_are_counted(
    tmp_path: Path,
) -> None:
    usage = MemoryUsage()
    meter = meter_on(tmp_path, usage)
    await meter.refresh_state()
    log = meter.folder.access_log
    log.write_text("1 172.30.0.2 TCP_TUNNEL/200 6000 0 CONNECT pypi.org:443\n")
    async with meter.lock:
        await meter.restart_log()
    assert log.read_text() == ""
    log.write_text("1 172.30.0.2 TCP_TUNNEL/200 10 0 CONNECT pypi.org:443\n")
    await meter.read_log()
    assert (await usage.load(["exp_1"]))["exp_1"].bytes == 6_010
