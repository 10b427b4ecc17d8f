"""A server that is not root warns when sandboxes would run as a uid that cannot write."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from app import options as main
from app.settings import load_settings


@pytest.mark.parametrize(
    ("euid", "sandbox_user", "warned"),
    [
        (10001, "1000:1000", True),  # the image's server with the default: unwritable
        (10001, "10001:10001", False),  # the image's setting
        (0, "1000:1000", False),  # root hands the workspace over
    ],
)
def test_the_warning_names_the_fix(
    monkeypatch: pytest.MonkeyPatch, euid: int, sandbox_user: str, warned: bool
) -> None:
    monkeypatch.setenv("SANDBOX_MCP_SANDBOX_USER", sandbox_user)
    monkeypatch.setattr(main.os, "geteuid", lambda: euid)
    monkeypatch.setattr(main.os, "getegid", lambda: euid)
    with capture_logs() as logs:
        main.warn_if_sandboxes_cannot_write(load_settings())
    events = [e for e in logs if e["event"] == "config.sandbox_user_cannot_write"]
    assert bool(events) is warned
    if warned:
        assert events[0]["fix"] == f"set SANDBOX_MCP_SANDBOX_USER={euid}:{euid} or run as root"
