"""The state dir: where the database, the slots (dir backend), keys and artifacts live."""

from __future__ import annotations

import contextlib
import os
import secrets

from app.errors import ServiceError
from app.settings import StorageSettings


class StateDirUnusable(ServiceError):
    code = "STATE_DIR_UNUSABLE"


def prepare_state_dir(storage: StorageSettings) -> None:
    """Create the state dir (0700) if needed and prove it can be written.

    Raises:
        StateDirUnusable: it cannot be created or written.
    """
    state_dir = storage.state_dir
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        probe = state_dir / f".write-test-{os.getpid()}-{secrets.token_hex(4)}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StateDirUnusable(
            f"The state dir {state_dir} cannot be written ({exc.strerror}); set "
            "SANDBOX_MCP_STATE_DIR to a folder this user owns.",
            reason=exc.strerror,
        ) from exc


DEPLOYMENT_FILE = "deployment-id"


def deployment_id(storage: StorageSettings) -> str:
    """The id of this deployment (every process on this state dir shares it), made once.

    Containers carry it in their managed label, so one deployment's start-up sweep
    never removes another's containers on a shared Docker engine.

    Raises:
        StateDirUnusable: the state dir cannot be written.
    """
    prepare_state_dir(storage)
    path = storage.state_dir / DEPLOYMENT_FILE
    if path.exists():
        return path.read_text().strip()
    # Written whole under a private name, then linked into place: a reader never sees a
    # half-written id, and of processes starting together the first link wins.
    draft = storage.state_dir / f".{DEPLOYMENT_FILE}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        draft.write_text(secrets.token_hex(8) + "\n")
        draft.chmod(0o600)
        with contextlib.suppress(FileExistsError):
            os.link(draft, path)
        draft.unlink()
        return path.read_text().strip()
    except OSError as exc:
        raise StateDirUnusable(
            f"The state dir {storage.state_dir} cannot be written ({exc.strerror}).",
            reason=exc.strerror,
        ) from exc
