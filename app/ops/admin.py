"""The operator's commands: ``check`` (changes nothing), ``provision``, and the preflight
``serve`` runs before it listens."""

from __future__ import annotations

from dataclasses import asdict

from app.errors import DatabaseUnavailable
from app.ops.base_images import how_to_build
from app.root.slot_storage import open_slots, slot_store
from app.root.state_dir import StateDirUnusable, prepare_state_dir
from app.runtime.docker.probe import DockerProbe
from app.settings import Settings
from app.storage.db import Repository, create_engine, upgrade_schema
from app.storage.slots.pool_store import SqlPoolState
from app.version import service_version
from pool.provision import provision_dir, provision_zfs


async def preflight(settings: Settings) -> None:
    """Fail before listening if the state dir, the database or the slots are unusable.

    Raises:
        StateDirUnusable: the state dir cannot be written.
        DatabaseUnavailable: the database cannot be reached or migrated.
        SlotsMissing: slots of the pool were never provisioned.
        PoolError: the slot storage cannot be opened.
    """
    await prepare_storage(settings)
    store = slot_store(settings)
    try:
        await open_slots(store, settings)
    finally:
        await store.close()


async def prepare_storage(settings: Settings) -> None:
    """Create the state dir and bring the schema up to date."""
    prepare_state_dir(settings.storage)
    engine = create_engine(settings.storage.effective_database_url)
    try:
        await upgrade_schema(engine)
    finally:
        await engine.dispose()


async def check(settings: Settings) -> dict[str, object]:
    """What `sandbox-mcp check` reports: can this configuration serve? (changes nothing)."""
    state: dict[str, object] = {"path": str(settings.storage.state_dir), "ok": True}
    try:
        prepare_state_dir(settings.storage)
    except StateDirUnusable as exc:
        state = {"path": str(settings.storage.state_dir), "ok": False, "reason": exc.message}
    database: dict[str, object] = {"ok": True}
    engine = create_engine(settings.storage.effective_database_url)
    try:
        await Repository(engine).ping()
    except DatabaseUnavailable as exc:
        database = {"ok": False, "reason": exc.details["reason"]}
    finally:
        await engine.dispose()
    probe = DockerProbe(
        images=settings.runtime.image_list, default_image=settings.runtime.default_image
    )
    try:
        runtime = await probe()
    finally:
        probe.close()
    report = runtime.as_dict()
    if runtime.reachable and not runtime.can_run_experiments:
        report["reason"] = f"{runtime.reason}: {how_to_build(settings.runtime.default_image)}"
    elif not runtime.reachable:
        report["reason"] = (
            f"{runtime.reason} Start the Docker engine, or point DOCKER_HOST at its socket."
        )
    ok = bool(state["ok"] and database["ok"] and runtime.can_run_experiments)
    return {
        "version": service_version(),
        "state_dir": state,
        "database": database,
        "runtime": report,
        "ok": ok,
    }


async def provision(
    settings: Settings, slots: int, zfs_parent: str | None, quota: str | None, owner: str | None
) -> dict[str, object]:
    """Create or repair ``slots`` slots; the leased ones (from the database) are left alone.

    Raises:
        StateDirUnusable, DatabaseUnavailable: as for ``preflight``.
        PoolError: provisioning failed (no pool, unknown owner, bad quota, ...).
    """
    await prepare_storage(settings)
    engine = create_engine(settings.storage.effective_database_url)
    try:
        snapshot = await SqlPoolState(engine).load()
    finally:
        await engine.dispose()
    leased = {record.index for record in snapshot.slots}
    if zfs_parent:
        report = await provision_zfs(zfs_parent, slots, quota=quota, owner=owner, leased=leased)
    else:
        report = await provision_dir(
            settings.storage.state_dir, slots, owner=owner, leased=leased, seal=True
        )
    return {"backend": "zfs" if zfs_parent else "dir", "slots": slots, **asdict(report)}
