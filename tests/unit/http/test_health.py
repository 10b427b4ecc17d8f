from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx2
from db_testkit import migrated_sqlite
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.routing import Route

from app.http.health import HealthEndpoint
from app.runtime.docker.probe import RuntimeStatus
from app.storage.db import Repository, create_engine
from pool.leases import PoolStats


async def pool_stats() -> PoolStats:
    return PoolStats(size=5, busy=2, free=2, reserved=1, queued=3, oldest_wait_s=4.5)


async def docker_up() -> RuntimeStatus:
    return RuntimeStatus(True, version="20.10.24")


async def docker_down() -> RuntimeStatus:
    return RuntimeStatus(False, reason="connection refused")


async def get_health(
    engine: AsyncEngine, runtime: Callable[[], Awaitable[RuntimeStatus]]
) -> httpx2.Response:
    """``/health`` of a service on ``engine`` (disposed afterwards) whose runtime probe
    answers ``runtime``."""
    endpoint = HealthEndpoint("1.2.3", Repository(engine).ping, pool_stats, runtime)
    app = Starlette(routes=[Route("/health", endpoint.handle)])
    transport = httpx2.ASGITransport(app=app)
    try:
        async with httpx2.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get("/health")
    finally:
        await engine.dispose()


async def test_healthy_service_reports_pool_runtime_and_database(tmp_path: Path) -> None:
    response = await get_health(await migrated_sqlite(tmp_path), docker_up)
    assert response.status_code == 200
    assert response.headers["cache-control"] == "no-store"
    assert response.json() == {
        "status": "ok",
        "version": "1.2.3",
        "pool": {"size": 5, "busy": 2, "free": 2, "reserved": 1, "queued": 3, "oldest_wait_s": 4.5},
        "runtime": {"reachable": True, "version": "20.10.24", "reason": None},
        "database": {"ok": True},
    }


async def test_unreachable_database_gives_503_with_the_reason() -> None:
    response = await get_health(
        create_engine("postgresql+asyncpg://u:secretpw@127.0.0.1:1/db"), docker_up
    )
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["database"]["ok"] is False
    assert body["database"]["reason"]
    assert body["reasons"][0].startswith("The database is unavailable")
    assert "secretpw" not in response.text


async def test_unreachable_docker_is_degraded_not_down(tmp_path: Path) -> None:
    response = await get_health(
        create_engine(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}"), docker_down
    )
    assert response.status_code == 200
    assert response.json()["status"] == "degraded"
    assert response.json()["runtime"]["reason"] == "connection refused"


async def test_a_missing_default_image_is_degraded_and_named(tmp_path: Path) -> None:
    from app.runtime.docker.probe import ImagesStatus

    async def image_missing() -> RuntimeStatus:
        images = ImagesStatus(ready=("a:1",), missing=("b:1",), default="b:1")
        return RuntimeStatus(True, "27.0", "the default image b:1 is not built", images)

    response = await get_health(await migrated_sqlite(tmp_path), image_missing)
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "degraded"
    assert body["runtime"]["images"] == {
        "ready": ["a:1"],
        "missing": ["b:1"],
        "default": "b:1",
        "default_ready": False,
    }
