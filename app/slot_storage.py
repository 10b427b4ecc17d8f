"""The configured slot storage: built without I/O at wiring time, opened in the lifespan."""

from __future__ import annotations

from app.errors import ServiceError
from app.settings import Settings
from pool.provision import provision_dir
from pool.slots import SlotStore
from pool.slots_dir import DirSlotStore
from pool.slots_zfs import ZfsSlotStore


class SlotsMissing(ServiceError):
    code = "SLOTS_MISSING"


def slot_store(settings: Settings) -> SlotStore:
    """The store ``SANDBOX_MCP_SLOT_BACKEND`` names; nothing is read until it is opened."""
    if settings.slot_backend == "dir":
        return DirSlotStore(settings.state_dir)
    assert settings.zfs_parent is not None  # validated by Settings
    return ZfsSlotStore(settings.zfs_parent)


async def open_slots(store: SlotStore, settings: Settings) -> None:
    """Open ``store`` and make sure every slot of the pool exists.

    The dir backend lives in the server's own state dir, so the server creates
    missing folders itself; ZFS datasets are created only by `sandbox-mcp
    provision`, which needs administrator rights.

    Raises:
        SlotsMissing: slots of the pool were never provisioned.
        PoolError: the slot storage cannot be opened.
    """
    size = settings.pool_size
    if settings.slot_backend == "dir":
        await provision_dir(settings.state_dir, size, owner=None)
    await store.open()
    missing = await store.missing(size)
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise SlotsMissing(
            f"{len(missing)} of {size} slots are missing or unusable ({shown}); run "
            f"`sandbox-mcp provision --slots {size} --zfs-parent {settings.zfs_parent}` as root "
            "(it repairs, and never touches a leased slot)."
        )
