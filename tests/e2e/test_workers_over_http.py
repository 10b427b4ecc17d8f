"""Three server processes on one PostgreSQL keep every promise of the slot pool (issue 14).

Three real servers (the probe app: the real server plus a slot-taking tool) on
loopback share one state dir and one fresh PostgreSQL database. Signed-in users,
more than the pool has slots, call round-robin across the processes; the elected
watchdog's process is killed with kill -9 mid-run. Each process logs every
committed pool change as a ``pool.event`` line carrying the database's order of
the change; replaying all three logs in that order checks what the pool
promises, whichever process served which call.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
import sqlalchemy as sa
from db_testkit import fresh_postgres
from e2e_server import RunningServer, free_port, start_server, stop_server
from mcp_http import probe, tool
from oauth_browser import ManualClient
from sqlalchemy.ext.asyncio import create_async_engine
from stated_limits import stated

from pool.leases import label_of

pytestmark = pytest.mark.e2e

USERS = 5
POOL = 2

ENV = {
    "SANDBOX_MCP_AUTH": "oauth",
    "SANDBOX_MCP_POOL_SIZE": str(POOL),
    "SANDBOX_MCP_IDLE_TIMEOUT_S": "10",
    # Queued calls wait in the server: a waiter on one process is woken by a slot
    # handed over on another (LISTEN/NOTIFY).
    "SANDBOX_MCP_QUEUE_WAIT_S": "4",
    "SANDBOX_MCP_SIGNINS_PER_MINUTE": "100",
}
READY = "Your sandbox is ready"


@dataclass
class User:
    token: str
    label: str = ""
    served: int = 0
    ready_notes: int = 0
    positions: list[int] = field(default_factory=list)


def pool_events(servers: list[RunningServer]) -> list[dict[str, Any]]:
    events = []
    for server in servers:
        for line in server.log().splitlines():
            if line.startswith("{") and '"pool.event"' in line:
                events.append(json.loads(line))
    assert all(isinstance(e["order"], int) for e in events)
    return sorted(events, key=lambda e: e["order"])


def replay(events: list[dict[str, Any]]) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Check every promise on the changes in the order they were committed; returns how
    many "ready" notes each sandbox was given, and the notes not shown yet."""
    holders: dict[int, tuple[str, str]] = {}  # slot -> (state, sandbox)
    queue: list[str] = []
    pending: dict[str, list[str]] = {}
    readies: dict[str, int] = {}
    for event in events:
        kind, who, slot = event["kind"], event["sandbox"], event.get("slot")
        if kind == "queued":
            assert who not in queue
            queue.append(who)
        elif kind == "dequeued":
            queue.remove(who)
        elif kind == "leased":
            assert slot not in holders, f"slot {slot} leased twice: {event}"
            assert not queue, f"a newcomer was served while {len(queue)} waited: {event}"
            assert who not in [h for _, h in holders.values()]
            holders[slot] = ("leased", who)
        elif kind == "reserved":
            assert holders.get(slot, ("", ""))[0] in ("resetting", "lapsed"), event
            assert queue[:1] == [who], f"served out of queue order: {event} {queue}"
            queue.pop(0)
            holders[slot] = ("reserved", who)
            pending.setdefault(who, []).append("ready")
            readies[who] = readies.get(who, 0) + 1
        elif kind == "claimed":
            assert holders.get(slot) == ("reserved", who), event
            holders[slot] = ("leased", who)
        elif kind == "lapsed":
            assert holders.get(slot) == ("reserved", who), event
            holders[slot] = ("lapsed", who)
        elif kind == "noted":
            pending.setdefault(who, []).append(event["note"])
        elif kind == "resetting":
            assert holders.get(slot) == ("leased", who), event
            holders[slot] = ("resetting", who)
        elif kind == "freed":
            assert holders.get(slot, ("", ""))[0] in ("resetting", "lapsed"), event
            del holders[slot]
        elif kind == "notes":
            for note in event["notes"]:
                assert note in pending.get(who, []), f"a note delivered twice: {event}"
                pending[who].remove(note)
    return readies, {who: sorted(notes) for who, notes in pending.items() if notes}


async def notes_kept(url: str) -> dict[str, list[str]]:
    """The one-time notes the database still keeps for a next call, by sandbox label."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(sa.text("SELECT sandbox_key, kind FROM pool_notes"))).all()
    finally:
        await engine.dispose()
    kept: dict[str, list[str]] = {}
    for key, kind in rows:
        kept.setdefault(label_of(key), []).append(kind)
    return {who: sorted(notes) for who, notes in kept.items()}


async def test_three_processes_one_postgresql_keep_the_pool_s_promises_through_a_kill_9(
    http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    async with fresh_postgres() as url:
        ports = [free_port() for _ in range(3)]
        # One service behind one public address (tokens are bound to it), as behind a
        # proxy spreading connections over the processes.
        public = f"http://127.0.0.1:{ports[0]}"
        env = {**ENV, "SANDBOX_MCP_DATABASE_URL": url, "SANDBOX_MCP_PUBLIC_URL": public}
        servers: list[RunningServer] = []
        try:
            for port in ports:
                servers.append(start_server(state, probe=True, port=port, **env))
            # Each user signs in on one process; the token works on all of them.
            users = []
            for index in range(USERS):
                client = await ManualClient.register(http, servers[index % 3].base_url)
                users.append(User(await client.access_token(http)))
            for index, user in enumerate(users):
                status = await tool(http, servers[(index + 1) % 3], user.token, "sandbox_status")
                user.label = status["sandbox"]
            live = list(servers)
            killed: list[RunningServer] = []
            first_wave = asyncio.Event()

            async def call(user: User, turn: int) -> dict[str, Any] | None:
                server = live[turn % len(live)]
                try:
                    return await probe(http, server, user.token)
                except httpx2.TransportError:
                    return None  # that process died under the call: try the next one

            async def work(index: int) -> None:
                user, turn = users[index], index
                while user.served < 2:  # served, then one more call on the lease
                    turn += 1
                    result = await call(user, turn)
                    if result is None:
                        continue
                    user.ready_notes += sum(READY in note for note in result.get("notes", []))
                    if not result["is_error"]:
                        user.served += 1
                        if sum(u.served > 0 for u in users) >= POOL:
                            first_wave.set()  # every slot was taken once: time to kill
                        continue
                    error = result["error"]
                    assert error["code"] == "SANDBOX_QUEUED", result
                    user.ready_notes += sum(READY in n for n in error.get("notes", []))
                    user.positions.append(error["position"])

            async def kill_the_watchdog() -> None:
                await first_wave.wait()
                leader = next((s for s in servers if "watchdog.elected" in s.log()), servers[0])
                leader.process.send_signal(signal.SIGKILL)
                leader.process.wait(timeout=10)
                live.remove(leader)
                killed.append(leader)

            await asyncio.wait_for(
                asyncio.gather(kill_the_watchdog(), *(work(i) for i in range(USERS))), 150
            )
            assert len(killed) == 1
            # Another process took the watchdog over and went on emptying idle sandboxes.
            assert any("watchdog.elected" in s.log() for s in live)
        finally:
            for server in servers:
                if server.process.poll() is None:
                    stop_server(server)
        events = pool_events(servers)
        readies, undelivered = replay(events)
        # Notes not shown yet ("emptied", for users who stopped calling) wait in the
        # database for their next call: none lost, none shown and still kept.
        assert undelivered == await notes_kept(url)
        assert all(notes == ["emptied"] for notes in undelivered.values())
        assert {e["sandbox"] for e in events if e["kind"] in ("leased", "claimed")} == {
            u.label for u in users
        }
        # Every one-time note reached its user once, through whichever process.
        for user in users:
            assert user.ready_notes == readies.get(user.label, 0), user
        assert sum(readies.values()) >= USERS - POOL  # the queue really was used
        assert any(p > 1 for u in users for p in u.positions)


def _elected_at(server: RunningServer) -> float | None:
    """When ``server`` logged that it took the watchdog (epoch seconds), if it did."""
    for line in server.log().splitlines():
        if line.startswith("{") and '"watchdog.elected"' in line:
            stamp = json.loads(line)["timestamp"].replace("Z", "+00:00")
            return datetime.fromisoformat(stamp).timestamp()
    return None


async def test_the_watchdog_is_taken_over_within_the_documented_bound(tmp_path: Path) -> None:
    """docs/several-processes.md: when the watchdog's process dies, another takes over on
    its next tick, within min(5, IDLE_TIMEOUT_S/10) s; here with the default idle
    timeout (docs/limits.md), so 5 s, after a kill -9 of the elected process."""
    text = " ".join(
        (Path(__file__).parents[2] / "docs" / "several-processes.md").read_text().split()
    )
    assert "within `min(5, IDLE_TIMEOUT_S/10)` s" in text, "the documented bound changed"
    bound = min(5, stated("IDLE_TIMEOUT_S") / 10)
    async with fresh_postgres() as url:
        env = {"SANDBOX_MCP_DATABASE_URL": url, "SANDBOX_MCP_POOL_SIZE": str(POOL)}
        servers = [start_server(tmp_path / "state", **env) for _ in range(2)]
        try:
            for _ in range(int(bound * 3 / 0.1)):  # the first tick elects one
                leaders = [s for s in servers if _elected_at(s) is not None]
                if leaders:
                    break
                await asyncio.sleep(0.1)
            [leader] = leaders
            [other] = [s for s in servers if s is not leader]
            leader.process.send_signal(signal.SIGKILL)
            killed_at = time.time()
            leader.process.wait(timeout=10)
            for _ in range(int(bound * 4 / 0.1)):
                if (taken_at := _elected_at(other)) is not None:
                    break
                await asyncio.sleep(0.1)
            assert taken_at is not None, f"no take-over in {bound * 4} s"
            took = taken_at - killed_at
            print(f"watchdog taken over {took:.2f} s after the kill -9 (bound {bound} s)")
            # The tick's own work on a loaded machine comes on top of the bound, never
            # a whole further interval.
            assert took <= bound + 2, (took, bound)
        finally:
            for server in servers:
                if server.process.poll() is None:
                    stop_server(server)
