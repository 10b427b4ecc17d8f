"""The egress meter: a big access log is read off the event loop, counted per
experiment, and stops the experiment that reaches its cap."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest
from egress_fakes import MemoryUsage

from app.errors import DatabaseUnavailable
from app.runtime import egress_usage
from app.runtime.egress_meter import EgressMeter
from app.runtime.egress_usage import Client, Ledger, LogLine
from app.storage.egress_store import Usage

LINES = 120_000  # about 9 MB: more than two reads of the log


def big_log(path: Path) -> None:
    tunnel = "1764590000.123 172.30.0.2 TCP_TUNNEL/200 1000 200 CONNECT pypi.org:443\n"
    denied = "1764590000.123 172.30.0.3 TCP_DENIED/403 3900 180 CONNECT evil.example:443\n"
    with path.open("w") as file:
        for i in range(LINES):
            file.write(denied if i % 10 == 0 else tunnel)


async def test_a_big_log_is_parsed_off_the_event_loop_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "access.log"
    big_log(log)
    loop_thread = threading.get_ident()
    parsed_on: set[int] = set()
    parse = LogLine.parse

    def spying(line: str) -> LogLine | None:
        parsed_on.add(threading.get_ident())
        return parse(line)

    monkeypatch.setattr(egress_usage.LogLine, "parse", staticmethod(spying))
    ledger = Ledger(10**12)
    ledger.add(Client("c1", "172.30.0.2", ("pypi.org",), "exp_1"))
    ledger.add(Client("c2", "172.30.0.3", ("pypi.org",), "exp_2"))
    usage = MemoryUsage()
    meter = EgressMeter(ledger, usage, write_state=lambda: None)
    meter.open(log, "172.30.0.1", 3128)
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
    assert recorded["exp_2"].bytes == LINES // 10 * 4080
    client = ledger.get("c2")
    assert client is not None
    assert client.refusals == LINES // 10


async def test_the_log_reaching_the_cap_blocks_records_and_cuts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuts: list[str] = []
    monkeypatch.setattr(
        "app.runtime.egress_meter.cut", lambda gateway, port, client: cuts.append(client) or 1
    )
    log = tmp_path / "access.log"
    log.write_text("1 172.30.0.2 TCP_TUNNEL/200 6000 0 CONNECT pypi.org:443\n")
    states: list[dict[str, object]] = []
    ledger = Ledger(10_000)
    ledger.add(Client("c1", "172.30.0.2", ("pypi.org",), "exp_1"))
    usage = MemoryUsage()
    await usage.add({"exp_1": 5_000})  # moved before a restart
    meter = EgressMeter(ledger, usage, write_state=lambda: states.append(ledger.state()))
    meter.open(log, "172.30.0.1", 3128)
    await meter.load(["exp_1"])
    assert states == []
    assert cuts == []
    await meter.read_log()
    assert (await usage.load(["exp_1"]))["exp_1"].capped is True
    assert states[-1] == {"172.30.0.2": {"allow": ["pypi.org"], "blocked": True}}
    assert cuts == ["172.30.0.2"]


class FailingOnce(MemoryUsage):
    def __init__(self) -> None:
        super().__init__()
        self.fail = True

    async def add(self, moved: Mapping[str, int]) -> dict[str, Usage]:
        if self.fail:
            self.fail = False
            raise DatabaseUnavailable("the database is restarting")
        return await super().add(moved)


async def test_bytes_counted_while_the_database_is_down_are_recorded_later(
    tmp_path: Path,
) -> None:
    log = tmp_path / "access.log"
    log.write_text("1 172.30.0.2 TCP_TUNNEL/200 6000 0 CONNECT pypi.org:443\n")
    ledger = Ledger(10_000)
    ledger.add(Client("c1", "172.30.0.2", ("pypi.org",), "exp_1"))
    usage = FailingOnce()
    meter = EgressMeter(ledger, usage, write_state=lambda: None)
    meter.open(log, "172.30.0.1", 3128)
    await meter.read_log()  # the database refuses: nothing raised, nothing lost
    with log.open("a") as file:
        file.write("1 172.30.0.2 TCP_TUNNEL/200 1000 0 CONNECT pypi.org:443\n")
    await meter.read_log()
    assert (await usage.load(["exp_1"]))["exp_1"] == Usage(7_000, False)
