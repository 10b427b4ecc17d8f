"""RFC 8414 and RFC 9728 discovery documents, built from configuration only."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse

from auth.config import AuthConfig

# Browser-based MCP clients read discovery documents across origins; they hold no secret.
_HEADERS = {"Access-Control-Allow-Origin": "*", "Cache-Control": "public, max-age=3600"}


@dataclass
class AuthorizationServerMetadataHandler:
    config: AuthConfig

    async def handle(self, request: Request) -> JSONResponse:
        return JSONResponse(self.config.authorization_server_metadata(), headers=_HEADERS)


@dataclass
class ProtectedResourceMetadataHandler:
    config: AuthConfig

    async def handle(self, request: Request) -> JSONResponse:
        return JSONResponse(self.config.protected_resource_metadata(), headers=_HEADERS)
