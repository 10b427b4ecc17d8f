"""The warm pool's sizing policy (app.runtime.warm.demand), on a fake clock."""

from __future__ import annotations

from app.runtime.warm.demand import IDLE_MB, WarmBudget, WarmDemand


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def demand(
    *,
    floor: int = 2,
    max_containers: int = 40,
    memory_mb: int = 10_000,
    share: int = 100,
    leased: set[str] | None = None,
    queued: list[int] | None = None,
) -> tuple[WarmDemand, Clock]:
    clock = Clock()
    held = leased if leased is not None else set()
    waiting = queued if queued is not None else [0]
    policy = WarmDemand(
        WarmBudget(floor, max_containers, memory_mb),
        address_share_percent=share,
        holds_slot=lambda key: key in held,
        queued=lambda: waiting[0],
        clock=clock,
    )
    return policy, clock


def test_an_idle_server_keeps_its_floor() -> None:
    policy, _ = demand(floor=2)
    assert policy.target() == 2


def test_each_sign_in_without_a_slot_adds_one_until_its_first_call() -> None:
    leased: set[str] = set()
    policy, _ = demand(floor=2, leased=leased)
    for i in range(5):
        policy.signed_in(f"key-{i}", f"10.0.0.{i}")
    assert policy.target() == 7
    leased.update({"key-0", "key-1"})  # their first calls took a slot
    assert policy.target() == 5


def test_a_sign_in_that_never_calls_fades_after_its_window() -> None:
    policy, clock = demand(floor=2)
    policy.signed_in("key", "10.0.0.1")
    assert policy.target() == 3
    clock.now += 121
    assert policy.target() == 2


def test_a_forming_queue_raises_the_target() -> None:
    queued = [0]
    policy, _ = demand(floor=2, queued=queued)
    queued[0] = 6
    assert policy.target() == 8
    queued[0] = 0
    assert policy.target() == 2


def test_the_rate_of_creates_keeps_the_pool_up_then_it_shrinks_to_its_floor() -> None:
    policy, clock = demand(floor=2)
    for _ in range(60):  # 60 creates in the last minute: 10 expected in the next 10 s
        policy.created()
        clock.now += 0.5
    assert policy.target() == 12
    clock.now += 61  # a minute without any
    assert policy.target() == 2


def test_the_ceiling_is_the_smaller_of_containers_and_memory() -> None:
    by_count = WarmBudget(floor=2, max_containers=10, max_memory_mb=10_000)
    assert by_count.ceiling == 10
    by_memory = WarmBudget(floor=2, max_containers=100, max_memory_mb=int(5 * IDLE_MB))
    assert by_memory.ceiling == 5
    assert WarmBudget(floor=3, max_containers=0, max_memory_mb=0).ceiling == 3  # never below


def test_no_signal_grows_the_pool_past_its_budget() -> None:
    policy, _ = demand(floor=2, max_containers=10, queued=[50])
    for i in range(100):
        policy.signed_in(f"key-{i}", f"10.0.{i}.1")
        policy.created()
    assert policy.target() == 10


def test_one_address_signing_in_many_times_grows_it_by_its_share_only() -> None:
    # A ceiling of 40 and a 5 % address share: one address counts 2 sign-ins at most.
    policy, _ = demand(floor=2, max_containers=40, share=5)
    for i in range(500):
        policy.signed_in(f"hostile-{i}", "203.0.113.7")
    assert policy.target() == 4
    # Other addresses still grow it by theirs: the hostile one took nothing from them.
    for i in range(3):
        policy.signed_in(f"user-{i}", f"198.51.100.{i}")
    assert policy.target() == 7


def test_a_rising_signal_wakes_the_pool() -> None:
    policy, _ = demand()
    woken: list[int] = []
    policy.on_change(lambda: woken.append(1))
    policy.signed_in("key", "10.0.0.1")
    policy.created()
    assert len(woken) == 2
