"""Slot names, errors, and the validation provisioning does before touching anything."""

from __future__ import annotations

import pytest

from pool import _zfs
from pool.errors import PoolError
from pool.provision import parse_quota, provision_zfs, resolve_owner
from pool.slots import name_of


@pytest.mark.parametrize(
    ("index", "name"), [(0, "slot-000"), (7, "slot-007"), (499, "slot-499"), (1000, "slot-1000")]
)
def test_name_of(index: int, name: str) -> None:
    assert name_of(index) == name


def test_name_of_refuses_negative_indices() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        name_of(-1)


def test_pool_error_carries_code_message_and_details() -> None:
    err = PoolError("SLOT_MISSING", "Slot slot-003 is gone; run provision.", {"slot": "slot-003"})
    assert str(err) == err.message == "Slot slot-003 is gone; run provision."
    assert err.code == "SLOT_MISSING"
    assert err.details == {"slot": "slot-003"}


@pytest.mark.parametrize(
    ("quota", "size"),
    [("10G", 10 * 1024**3), ("512M", 512 * 1024**2), ("64k", 64 * 1024), ("4096", 4096),
     ("1T", 1024**4), (" 2G ", 2 * 1024**3)],
)  # fmt: skip
def test_parse_quota(quota: str, size: int) -> None:
    assert parse_quota(quota) == size


@pytest.mark.parametrize("quota", ["", "0", "10GB", "1.5G", "-1G", "ten", "10 G", "G", "010G"])
def test_parse_quota_refuses_malformed_sizes(quota: str) -> None:
    with pytest.raises(PoolError) as caught:
        parse_quota(quota)
    assert caught.value.code == "INVALID_QUOTA"
    assert "10G or 512M" in caught.value.message


def test_resolve_owner() -> None:
    assert resolve_owner(None) is None
    assert resolve_owner("root") == (0, 0)
    assert resolve_owner("0") == (0, 0)
    assert resolve_owner("4242424") == (4242424, 4242424)  # container uids have no passwd entry


def test_resolve_owner_refuses_unknown_names() -> None:
    with pytest.raises(PoolError) as caught:
        resolve_owner("nosuchuser-xyz")
    assert caught.value.code == "UNKNOWN_OWNER"
    assert "nosuchuser-xyz" in caught.value.message


async def refuse_zfs(*argv: str) -> str:
    raise AssertionError(f"zfs must not run for invalid input: {argv}")


@pytest.mark.parametrize(
    ("parent", "quota", "owner", "count", "code"),
    [
        ("tank/slots", "lots", None, 5, "INVALID_QUOTA"),
        ("tank/slots", "10G", "nosuchuser-xyz", 5, "UNKNOWN_OWNER"),
        ("tank/slots", None, None, 0, "INVALID_SLOT_COUNT"),
        ("tank/slots@snap", None, None, 5, "INVALID_DATASET"),
        ("/tank/slots", None, None, 5, "INVALID_DATASET"),
        ("tank/slots; rm -rf /", None, None, 5, "INVALID_DATASET"),
    ],
)
async def test_provision_zfs_validates_before_running_zfs(
    monkeypatch: pytest.MonkeyPatch,
    parent: str,
    quota: str | None,
    owner: str | None,
    count: int,
    code: str,
) -> None:
    monkeypatch.setattr(_zfs, "run", refuse_zfs)
    with pytest.raises(PoolError) as caught:
        await provision_zfs(parent, count, quota=quota, owner=owner)
    assert caught.value.code == code
