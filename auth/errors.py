"""OAuth errors as typed values; only the handlers turn them into responses."""

from __future__ import annotations

from typing import Literal

OAuthErrorCode = Literal[
    "invalid_request",
    "invalid_client",
    "invalid_grant",
    "unauthorized_client",
    "unsupported_grant_type",
    "unsupported_response_type",
    "invalid_scope",
    "invalid_target",
    "invalid_redirect_uri",
    "invalid_client_metadata",
    "access_denied",
    "server_error",
    "temporarily_unavailable",
    "slow_down",
]


class OAuthError(Exception):
    """An error answered per RFC 6749 section 5.2 (or 4.1.2.1 as a redirect).

    ``status`` is the HTTP status for a direct answer; ``description`` is
    human-readable and never echoes a credential.
    """

    def __init__(self, error: OAuthErrorCode, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.error: OAuthErrorCode = error
        self.description = description
        self.status = status

    def body(self) -> dict[str, str]:
        return {"error": self.error, "error_description": self.description}
