"""The zfs command runner's error translation, and ZfsSlotStore's checks on a fake listing."""

from __future__ import annotations

from pathlib import Path

import pytest

from pool import _zfs
from pool.errors import PoolError
from pool.slots_zfs import ZfsSlotStore


def sh(script: str) -> tuple[str, ...]:
    return ("sh", "-c", script)


async def test_run_returns_stdout() -> None:
    assert await _zfs.run(*sh("printf 'slotdev\\t/slotdev\\n'")) == "slotdev\t/slotdev\n"


@pytest.mark.parametrize(
    ("stderr", "code"),
    [
        ("cannot open 'tank/x': dataset does not exist", "ZFS_DATASET_NOT_FOUND"),
        ("cannot create 'nopool/a': no such pool 'nopool'", "ZFS_POOL_NOT_FOUND"),
        ("cannot destroy 'tank/x': dataset is busy", "ZFS_DATASET_BUSY"),
        ("umount: /tank/x: target is busy.", "ZFS_DATASET_BUSY"),
        (
            "connect: No such file or directory\\nPlease make sure that the zfs-fuse daemon is "
            "running.\\ninternal error: failed to initialize ZFS library",
            "ZFS_UNAVAILABLE",
        ),
        ("cannot set property for 'tank/x': bad numeric value 'abc'", "ZFS_COMMAND_FAILED"),
    ],
)
async def test_run_classifies_failures(stderr: str, code: str) -> None:
    with pytest.raises(PoolError) as caught:
        await _zfs.run(*sh(f"printf '{stderr}' >&2; exit 1"))
    err = caught.value
    assert err.code == code
    assert err.details["returncode"] == 1
    assert "\n" not in str(err.details["stderr"])
    assert str(err) == err.message


async def test_run_summarises_long_stderr_into_one_line() -> None:
    with pytest.raises(PoolError) as caught:
        await _zfs.run(*sh("for i in $(seq 1 200); do echo line $i >&2; done; exit 2"))
    summary = str(caught.value.details["stderr"])
    assert len(summary) <= 400
    assert summary.startswith("line 1; line 2")
    assert "sh -c" in caught.value.message


async def test_missing_binary_means_zfs_is_unavailable() -> None:
    with pytest.raises(PoolError) as caught:
        await _zfs.run("zfs-binary-that-does-not-exist", "list")
    assert caught.value.code == "ZFS_UNAVAILABLE"


class FakeZfs:
    """Answers `zfs destroy` with a scripted list of outcomes."""

    def __init__(self, *outcomes: str) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, ...]] = []

    async def __call__(self, *argv: str) -> str:
        self.calls.append(argv)
        outcome = self.outcomes.pop(0)
        if outcome == "ok":
            return ""
        raise PoolError(outcome, outcome)  # type: ignore[arg-type]


async def test_destroy_retries_while_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeZfs("ZFS_DATASET_BUSY", "ZFS_DATASET_BUSY", "ok")
    monkeypatch.setattr(_zfs, "run", fake)
    await _zfs.destroy("tank/x", first_delay=0.001)
    assert fake.calls == [("zfs", "destroy", "-r", "tank/x")] * 3


async def test_destroy_gives_up_on_other_errors_and_accepts_absence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_zfs, "run", FakeZfs("ZFS_COMMAND_FAILED"))
    with pytest.raises(PoolError):
        await _zfs.destroy("tank/x", first_delay=0.001)
    monkeypatch.setattr(_zfs, "run", FakeZfs("ZFS_DATASET_NOT_FOUND"))
    await _zfs.destroy("tank/x", first_delay=0.001)


async def test_destroy_stops_after_its_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_zfs, "run", FakeZfs(*["ZFS_DATASET_BUSY"] * 3))
    with pytest.raises(PoolError) as caught:
        await _zfs.destroy("tank/x", attempts=3, first_delay=0.001)
    assert caught.value.code == "ZFS_DATASET_BUSY"


def listing(*rows: tuple[str, str, str]) -> str:
    return "".join(f"{name}\t{prop}\t{value}\n" for name, prop, value in rows)


async def test_missing_checks_snapshot_mountpoint_and_mount(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = listing(
        ("tank/s", "type", "filesystem"),
        ("tank/s/slot-000", "type", "filesystem"),
        ("tank/s/slot-000", "mountpoint", "/tank/s/slot-000"),
        ("tank/s/slot-000", "mounted", "yes"),
        ("tank/s/slot-000@empty", "type", "snapshot"),
        ("tank/s/slot-001", "type", "filesystem"),  # no @empty
        ("tank/s/slot-001", "mountpoint", "/tank/s/slot-001"),
        ("tank/s/slot-001", "mounted", "yes"),
        ("tank/s/slot-002", "type", "filesystem"),  # mounted elsewhere
        ("tank/s/slot-002", "mountpoint", "/elsewhere"),
        ("tank/s/slot-002", "mounted", "yes"),
        ("tank/s/slot-002@empty", "type", "snapshot"),
        ("tank/s/slot-003", "type", "filesystem"),  # unmounted
        ("tank/s/slot-003", "mountpoint", "/tank/s/slot-003"),
        ("tank/s/slot-003", "mounted", "no"),
        ("tank/s/slot-003@empty", "type", "snapshot"),
    )

    async def fake_run(*argv: str) -> str:
        assert argv[:2] == ("zfs", "get")
        assert argv[-1] == "tank/s"
        return out

    monkeypatch.setattr(_zfs, "run", fake_run)
    store = ZfsSlotStore("tank/s")
    store._mountpoint = Path("/tank/s")

    assert await store.missing(5) == ["slot-001", "slot-002", "slot-003", "slot-004"]
    assert store.slot(3).root == Path("/tank/s/slot-003")
