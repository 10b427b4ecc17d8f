"""The CLI: every user mistake is one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from app.cli import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 1), out, err


def assert_no_traceback(text: str) -> None:
    assert "Traceback" not in text
    assert 'File "' not in text


def test_unknown_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["serve", "--bogus"], capsys)
    assert code == 2
    assert "unrecognized arguments: --bogus" in err
    assert_no_traceback(err)


def test_bad_port_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["serve", "--port", "99999"], capsys)
    assert code == 2
    assert "'99999' is not a TCP port (1-65535)" in err


def test_bad_environment_value_names_variable_value_and_rule(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOX_MCP_POOL_SIZE", "many")
    code, _, err = run(["serve"], capsys)
    assert code == 2
    assert err.startswith("sandbox-mcp: SANDBOX_MCP_POOL_SIZE='many' is invalid:")
    assert len(err.strip().splitlines()) == 1


def test_port_already_in_use(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOX_MCP_AUTH", "none")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = run(["serve", "--port", str(port)], capsys)
    assert code == 1
    assert f"cannot listen on 127.0.0.1:{port} (Address already in use)" in err
    assert_no_traceback(err)


def test_state_dir_that_cannot_be_written(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SANDBOX_MCP_STATE_DIR", str(blocker / "state"))
    monkeypatch.setenv("SANDBOX_MCP_AUTH", "none")
    code, _, err = run(["serve"], capsys)
    assert code == 1
    assert "cannot be written (Not a directory)" in err
    assert "SANDBOX_MCP_STATE_DIR" in err
    assert_no_traceback(err)


def test_unreachable_database(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOX_MCP_AUTH", "none")
    monkeypatch.setenv("SANDBOX_MCP_DATABASE_URL", "postgresql+asyncpg://u:pw9876@127.0.0.1:1/d")
    code, _, err = run(["serve"], capsys)
    assert code == 1
    assert err.startswith("sandbox-mcp: The database is unavailable (")
    assert "pw9876" not in err
    assert_no_traceback(err)


def test_check_reports_config_without_secrets_and_fails_without_docker(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    monkeypatch.setenv("SANDBOX_MCP_DATABASE_URL", "postgresql+asyncpg://u:pw5555@127.0.0.1:1/d")
    for argv in (["check"], ["--check"]):
        code, out, _ = run(argv, capsys)
        report = json.loads(out)
        assert code == 1
        assert report["ok"] is False
        assert report["runtime"]["reachable"] is False
        assert report["database"]["ok"] is False
        assert "pw5555" not in out
        assert report["config"]["database_url"] == "postgresql+asyncpg://u:***@127.0.0.1:1/d"
        assert report["config"]["pool_size"] == 500


def test_check_with_a_working_database_reports_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    code, out, _ = run(["check"], capsys)
    report = json.loads(out)
    assert report["database"] == {"ok": True}
    assert report["state_dir"]["ok"] is True
    assert code == 1  # Docker is still unreachable


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run([], capsys)
    assert code == 2
    assert "serve" in err


def test_provision_dir_slots_is_idempotent(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run(["provision", "--slots", "3"], capsys)
    assert code == 0
    assert json.loads(out)["created"] == 3
    slots = tmp_path / "state" / "slots"
    assert sorted(p.name for p in slots.iterdir() if not p.name.startswith(".")) == [
        "slot-000",
        "slot-001",
        "slot-002",
    ]
    (slots / "slot-001" / "work.txt").write_text("keep me")
    code, out, _ = run(["provision", "--slots", "3"], capsys)
    assert code == 0
    assert json.loads(out)["untouched"] == 3
    assert (slots / "slot-001" / "work.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["provision"], "the following arguments are required: --slots"),
        (["provision", "--slots", "0"], "'0' is not a slot count (1-10000)"),
        (["provision", "--slots", "2", "--quota", "1G"], "--quota needs --zfs-parent"),
    ],
)
def test_provision_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run(argv, capsys)
    assert code == 2
    assert message in err


def test_provision_unknown_owner_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["provision", "--slots", "1", "--owner", "no-such-user-xyz"], capsys)
    assert code == 1
    assert err.startswith("sandbox-mcp: ")
    assert "no-such-user-xyz" in err
    assert_no_traceback(err)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
async def test_connections_to_the_listening_socket_send_without_nagle(host: str) -> None:
    """asyncio turns Nagle off only on sockets that say they are TCP; with proto 0 every
    response waited out the client's delayed ACK (about 40 ms a request)."""
    import asyncio

    from app.cli import _bind

    sock = _bind(host, 0)
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = writer.get_extra_info("socket")
        accepted.append(raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_connect, sock=sock)
    try:
        port = sock.getsockname()[1]
        _, writer = await asyncio.open_connection(host, port)
        for _ in range(100):
            if accepted:
                break
            await asyncio.sleep(0.01)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    assert accepted == [1]


def test_serving_collects_the_young_generation_every_10000_allocations() -> None:
    """At CPython's 700 the light calls in flight set off a young collection every few
    calls (bench_light_calls_wrk.py); the older generations keep their thresholds."""
    import gc

    from app.cli import tune_collector

    before = gc.get_threshold()
    try:
        tune_collector()
        assert gc.get_threshold() == (10_000, before[1], before[2])
    finally:
        gc.set_threshold(*before)


def test_several_workers_on_sqlite_are_refused_in_one_sentence(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(["serve", "--workers", "3"], capsys)
    assert code == 2
    assert "--workers 3 needs PostgreSQL" in err
    assert "SANDBOX_MCP_DATABASE_URL=postgresql+asyncpg://" in err
    assert_no_traceback(err)
    monkeypatch.setenv("SANDBOX_MCP_WORKERS", "2")  # the setting, as a systemd unit sets it
    code, _, err = run(["serve"], capsys)
    assert code == 2
    assert "--workers 2 needs PostgreSQL" in err


def test_several_workers_may_offer_network_restricted() -> None:
    # One of them runs Squid (elected); all of them create restricted experiments.
    from app.ops import workers

    assert workers.refusal(2, "postgresql+asyncpg://u@localhost/db") is None


def test_a_bad_worker_count_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["serve", "--workers", "0"], capsys)
    assert code == 2
    assert "'0' is not a number of processes (1-64)" in err
