"""The state dir: where the database, the slots (dir backend), keys and artifacts live."""

from __future__ import annotations

from app.errors import ServiceError
from app.settings import Settings


class StateDirUnusable(ServiceError):
    code = "STATE_DIR_UNUSABLE"


def prepare_state_dir(settings: Settings) -> None:
    """Create the state dir (0700) if needed and prove it can be written.

    Raises:
        StateDirUnusable: it cannot be created or written.
    """
    state_dir = settings.state_dir
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        probe = state_dir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StateDirUnusable(
            f"The state dir {state_dir} cannot be written ({exc.strerror}); set "
            "SANDBOX_MCP_STATE_DIR to a folder this user owns.",
            reason=exc.strerror,
        ) from exc
