"""The sign-in's requests have database connections of their own: with every one of the
service's connections held by tenants' work, the sign-in's store, its admissions and
the registration budget still answer (issue 25: they queued behind tool calls under
the fairness bench's attack). The service is built as ``serve`` builds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.root.main import build_services
from app.settings import load_settings
from app.storage.db import upgrade_schema
from auth.store import IssuedCode


async def test_the_sign_in_answers_while_tenants_hold_every_service_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOX_MCP_AUTH", "oauth")
    monkeypatch.setenv("SANDBOX_MCP_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SANDBOX_MCP_SLOT_BACKEND", "dir")
    monkeypatch.setenv("SANDBOX_MCP_PUBLIC_URL", "https://sandbox.example")
    services = build_services(load_settings())
    assert services.auth is not None
    try:
        await upgrade_schema(services.engine)
        pool = services.engine.sync_engine.pool
        held = []
        try:
            # Every connection the tenants' work may have (15, none in overflow left).
            while pool.checkedout() < 15:  # type: ignore[attr-defined]
                held.append(await services.engine.connect())
            # On the service's engine each call waited for the pool's timeout (30 s),
            # then failed.
            store = services.auth.store
            assert await store.load_client("client-never-registered") is None
            code = IssuedCode("h", "192.0.2.7", 1.0, 601.0)
            admitted = await store.issue_code(
                code, burst_since=0.0, hourly_since=0.0, refuse=lambda _: None
            )
            assert admitted == code
            assert await services.auth.registrations.take("192.0.2.7") == 0
        finally:
            for connection in held:
                await connection.close()
    finally:
        services.docker_probe.close()
        await services.backend.aclose()
        await services.engine.dispose()
        await services.front_door.dispose()
