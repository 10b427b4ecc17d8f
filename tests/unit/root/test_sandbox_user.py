"""A server that may not chown warns when sandboxes would run as a uid that cannot write."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from app.root import runtime as assembly
from app.settings import load_settings


@pytest.mark.parametrize(
    ("euid", "capable", "sandbox_user", "warned"),
    [
        (10001, False, "1000:1000", True),  # not root, no CAP_CHOWN: unwritable
        (10001, False, "10001:10001", False),  # its own uid
        (10001, True, "10002:10002", False),  # the image: CAP_CHOWN hands workspaces over
        (0, True, "1000:1000", False),  # root hands the workspace over
    ],
)
def test_the_warning_names_the_fix(
    monkeypatch: pytest.MonkeyPatch, euid: int, capable: bool, sandbox_user: str, warned: bool
) -> None:
    monkeypatch.setattr(assembly, "can_chown", lambda: capable)
    monkeypatch.setenv("SANDBOX_MCP_SANDBOX_USER", sandbox_user)
    monkeypatch.setattr(assembly.os, "geteuid", lambda: euid)
    monkeypatch.setattr(assembly.os, "getegid", lambda: euid)
    with capture_logs() as logs:
        assembly.warn_if_sandboxes_cannot_write(load_settings().runtime)
    events = [e for e in logs if e["event"] == "config.sandbox_user_cannot_write"]
    assert bool(events) is warned
    if warned:
        assert events[0]["fix"] == f"set SANDBOX_MCP_SANDBOX_USER={euid}:{euid} or run as root"
