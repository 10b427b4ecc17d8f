"""A server anyone can sign in to never runs quota-less slots on its database's disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.root.slot_storage import SharedDisk, refuse_shared_disk
from app.settings import load_settings


def slots(state: Path) -> Path:
    folder = state / "slots"
    folder.mkdir(parents=True)
    return folder


def test_a_public_server_on_dir_slots_beside_its_sqlite_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SANDBOX_MCP_PUBLIC_URL", "https://mcp.example.test")
    settings = load_settings()
    with pytest.raises(SharedDisk) as refused:
        refuse_shared_disk(settings, slots(settings.storage.state_dir))
    assert "SANDBOX_MCP_SLOT_BACKEND=zfs" in refused.value.message
    assert "SANDBOX_MCP_ACCEPT_SHARED_DISK=true" in refused.value.message


@pytest.mark.parametrize(
    "env",
    [
        {},  # loopback: only this machine's users
        {"SANDBOX_MCP_PUBLIC_URL": "https://mcp.example.test", "SANDBOX_MCP_AUTH": "none"},
        {
            "SANDBOX_MCP_PUBLIC_URL": "https://mcp.example.test",
            "SANDBOX_MCP_ACCEPT_SHARED_DISK": "true",
        },
        {
            "SANDBOX_MCP_PUBLIC_URL": "https://mcp.example.test",
            "SANDBOX_MCP_DATABASE_URL": "postgresql+asyncpg://u:p@db.example.test/sandbox",
        },
        {
            "SANDBOX_MCP_PUBLIC_URL": "https://mcp.example.test",
            # /dev/shm is a filesystem of its own (tmpfs), out of the slots' reach.
            "SANDBOX_MCP_DATABASE_URL": "sqlite+aiosqlite:////dev/shm/sandbox-mcp-test.db",
        },
    ],
)
def test_what_may_share_or_not_share_a_disk(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    folder = slots(settings.storage.state_dir)
    assert os.stat("/dev/shm").st_dev != os.stat(folder).st_dev
    refuse_shared_disk(settings, folder)  # does not raise


def test_serve_refuses_it_in_one_sentence(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("SANDBOX_MCP_")}
    env |= {
        "SANDBOX_MCP_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_MCP_PUBLIC_URL": "https://mcp.example.test",
        "SANDBOX_MCP_POOL_SIZE": "2",
        "SANDBOX_MCP_PORT": "1",  # never reached: the refusal comes first
    }
    done = subprocess.run(
        [sys.executable, "-m", "app", "serve"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 1
    assert "share a filesystem with the database" in done.stderr
    assert "Traceback" not in done.stderr
