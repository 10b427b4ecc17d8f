"""``GET /health``: is the service usable, which images are built, and how full is the pool?

Never takes a slot."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from app.errors import DatabaseUnavailable
from app.runtime.docker.probe import RuntimeStatus
from pool.leases import PoolStats


@dataclass
class HealthEndpoint:
    version: str
    ping_database: Callable[[], Awaitable[None]]
    pool_stats: Callable[[], Awaitable[PoolStats]]
    probe_runtime: Callable[[], Awaitable[RuntimeStatus]]
    egress: Callable[[], dict[str, Any]] | None = None  # network "restricted"'s proxy

    async def handle(self, request: Request) -> JSONResponse:
        reasons: list[str] = []
        database: dict[str, object] = {"ok": True}
        pool: dict[str, object] | None = None
        try:
            await self.ping_database()
            pool = asdict(await self.pool_stats())
        except DatabaseUnavailable as exc:
            database = {"ok": False, "reason": exc.details["reason"]}
            reasons.append(exc.message)
        runtime = await self.probe_runtime()
        egress = self.egress() if self.egress is not None else None
        # The engine answers, the default image is built, and the proxy (if offered) runs.
        usable = runtime.can_run_experiments and (egress is None or egress["ok"])
        status = "unavailable" if reasons else "ok" if usable else "degraded"
        body: dict[str, object] = {
            # "degraded": sign-in and files work, experiments cannot start.
            "status": status,
            "version": self.version,
            "pool": pool,
            "runtime": runtime.as_dict(),
            "database": database,
        }
        if egress is not None:
            body["egress_proxy"] = egress
        if reasons:
            body["reasons"] = reasons
        # No-store: a cached "ok" from a proxy would hide an outage.
        headers = {"Cache-Control": "no-store"}
        return JSONResponse(body, status_code=503 if reasons else 200, headers=headers)
