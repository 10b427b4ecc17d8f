"""The configured slot storage: built without I/O at wiring time, opened in the lifespan."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy.engine import make_url

from app.errors import ServiceError
from app.settings import Settings
from jail.addresses import is_loopback_host
from pool.provision import provision_dir
from pool.slots import SlotStore
from pool.slots_dir import DirSlotStore
from pool.slots_zfs import ZfsSlotStore


class SlotsMissing(ServiceError):
    code = "SLOTS_MISSING"


class SharedDisk(ServiceError):
    code = "SHARED_DISK"


def slot_store(settings: Settings) -> SlotStore:
    """The store ``SANDBOX_MCP_SLOT_BACKEND`` names; nothing is read until it is opened."""
    if settings.pool.slot_backend == "dir":
        return DirSlotStore(settings.storage.state_dir)
    assert settings.pool.zfs_parent is not None  # validated by Settings
    return ZfsSlotStore(settings.pool.zfs_parent)


async def open_slots(store: SlotStore, settings: Settings) -> None:
    """Open ``store`` and make sure every slot of the pool exists.

    The dir backend lives in the server's own state dir, so the server creates
    missing folders itself; ZFS datasets are created only by `sandbox-mcp
    provision`, which needs administrator rights.

    Raises:
        SlotsMissing: slots of the pool were never provisioned.
        SharedDisk: a hosted pool of dir slots shares the database's filesystem.
        PoolError: the slot storage cannot be opened.
    """
    size, parent = settings.pool.size, settings.pool.zfs_parent
    if settings.pool.slot_backend == "dir":
        await provision_dir(settings.storage.state_dir, size, owner=None)
        refuse_shared_disk(settings, store.base)
    await store.open()
    missing = await store.missing(size)
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise SlotsMissing(
            f"{len(missing)} of {size} slots are missing or unusable ({shown}); run "
            f"`sandbox-mcp provision --slots {size} --zfs-parent {parent}` as root "
            "(it repairs, and never touches a leased slot)."
        )


def refuse_shared_disk(settings: Settings, slots: Path) -> None:
    """Refuse to serve anyone from quota-less dir slots on the database's filesystem.

    Folders have no kernel quota, only the measured budget of
    app/experiments/disk_budget.py, which a fast writer overshoots by what it
    writes in one interval: a few tenants doing so fill the filesystem, and if
    the SQLite database lives there too every sign-in and every call then fails. ZFS
    slots each have a quota; a database on another filesystem (or PostgreSQL) is out
    of a tenant's reach.

    Raises:
        SharedDisk: anyone may sign in (oauth, a public URL that is not loopback), dir
            slots, and the SQLite file on the slots' filesystem, unless
            ``SANDBOX_MCP_ACCEPT_SHARED_DISK`` says it is a trial.
    """
    public_host = urlsplit(settings.server.effective_public_url).hostname or ""
    if (
        not settings.auth.hosted
        or settings.pool.accept_shared_disk
        or is_loopback_host(public_host)
    ):
        return  # only this machine's users can reach a loopback server
    database = make_url(settings.storage.effective_database_url)
    if not database.drivername.startswith("sqlite") or not database.database:
        return  # a database server keeps its own disk
    folder = Path(database.database).parent
    if folder.exists() and os.stat(folder).st_dev != os.stat(slots).st_dev:
        return
    raise SharedDisk(
        f"The dir slot backend has only a soft byte budget (measured, so a fast writer "
        f"overshoots it), and its slots share a filesystem with the "
        f"database ({folder}): one tenant could fill it and stop the service for everyone. "
        "Use SANDBOX_MCP_SLOT_BACKEND=zfs (a quota per slot; see `sandbox-mcp provision`), "
        "or put the database on another filesystem (SANDBOX_MCP_DATABASE_URL, e.g. "
        "PostgreSQL), or, for a trial, set SANDBOX_MCP_ACCEPT_SHARED_DISK=true."
    )
