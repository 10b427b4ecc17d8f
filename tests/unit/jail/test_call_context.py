"""Per-call context, edit state and sandbox memory, including cross-talk under concurrency."""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from jail import (
    CallContext,
    EditState,
    Jail,
    JailError,
    ProjectMapCache,
    SandboxMemory,
    new_call_context,
)

TENANTS = 100
STEPS = 5


def _context(memory: SandboxMemory, n: int, root: Path) -> CallContext:
    return new_call_context(memory, f"key-{n}", request_id=f"req-{n}", slot_root=root)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_own_note(call: CallContext, step: int) -> None:
    """What a tool does in its worker thread: identity comes from its context only."""
    assert call.slot_root is not None
    content = f"{call.sandbox_key}:{step}".encode()
    with Jail.open(call.slot_root) as jail:
        jail.write_bytes(f"note-{step}.txt", content)
        assert jail.read_bytes(f"note-{step}.txt", max_bytes=100) == content
    call.edit_state.record_read(f"note-{step}.txt", _sha(content))


def _read_own_notes(call: CallContext) -> list[bytes]:
    assert call.slot_root is not None
    with Jail.open(call.slot_root) as jail:
        return [jail.read_bytes(f"note-{s}.txt", max_bytes=100) for s in range(STEPS)]


def _assert_no_cross_talk(memory: SandboxMemory, roots: list[Path]) -> None:
    for n, root in enumerate(roots):
        expected = {f"note-{s}.txt": f"key-{n}:{s}".encode() for s in range(STEPS)}
        assert {p.name: p.read_bytes() for p in root.iterdir()} == expected
        edits = memory.edit_state(f"key-{n}")
        assert len(edits) == STEPS
        for name, content in expected.items():
            edits.check_fresh(name, _sha(content))


@pytest.fixture
def roots(tmp_path: Path) -> list[Path]:
    made = [tmp_path / f"slot-{n:03d}" for n in range(TENANTS)]
    for root in made:
        root.mkdir()
    return made


async def test_concurrent_tasks_each_see_only_their_own_sandbox(roots: list[Path]) -> None:
    memory = SandboxMemory()

    async def tenant(n: int) -> list[bytes]:
        call = _context(memory, n, roots[n])
        for step in range(STEPS):
            await asyncio.sleep(random.random() / 1000)  # shuffle the interleaving
            await asyncio.to_thread(_write_own_note, call, step)
        return await asyncio.to_thread(_read_own_notes, call)

    results = await asyncio.gather(*(tenant(n) for n in range(TENANTS)))
    for n, notes in enumerate(results):
        assert notes == [f"key-{n}:{s}".encode() for s in range(STEPS)]
    _assert_no_cross_talk(memory, roots)


def test_concurrent_threads_each_see_only_their_own_sandbox(roots: list[Path]) -> None:
    memory = SandboxMemory()
    start = threading.Barrier(TENANTS)

    def tenant(n: int) -> list[bytes]:
        call = _context(memory, n, roots[n])
        start.wait()  # every thread has its context before any works
        for step in range(STEPS):
            _write_own_note(call, step)
        return _read_own_notes(call)

    with ThreadPoolExecutor(max_workers=TENANTS) as pool:
        results = list(pool.map(tenant, range(TENANTS)))
    for n, notes in enumerate(results):
        assert notes == [f"key-{n}:{s}".encode() for s in range(STEPS)]
    _assert_no_cross_talk(memory, roots)


def test_edit_state_requires_a_fresh_read() -> None:
    edits = EditState()
    with pytest.raises(JailError) as excinfo:
        edits.check_fresh("a.py", _sha(b"x"))
    assert excinfo.value.code == "EDIT_WITHOUT_READ"
    edits.record_read("src/./a.py", _sha(b"x"))
    edits.check_fresh("src/a.py", _sha(b"x"))
    with pytest.raises(JailError) as excinfo:
        edits.check_fresh("src/a.py", _sha(b"changed"))
    assert excinfo.value.code == "STALE_EDIT"
    assert excinfo.value.details == {"path": "src/a.py"}


def test_edit_state_forgets_paths_and_whatever_is_beneath() -> None:
    edits = EditState()
    for path in ("src/a.py", "src/sub/b.py", "srcx.py", "other.py"):
        edits.record_read(path, "h")
    edits.forget("src")
    assert len(edits) == 2
    edits.check_fresh("srcx.py", "h")
    edits.clear()
    assert len(edits) == 0


def test_edit_state_is_bounded() -> None:
    edits = EditState(max_entries=3)
    for n in range(4):
        edits.record_read(f"{n}.txt", "h")
    assert len(edits) == 3
    with pytest.raises(JailError) as excinfo:
        edits.check_fresh("0.txt", "h")
    assert excinfo.value.code == "EDIT_WITHOUT_READ"


def test_edit_state_refuses_paths_outside() -> None:
    with pytest.raises(JailError) as excinfo:
        EditState().record_read("../x", "h")
    assert excinfo.value.code == "PATH_OUTSIDE_SANDBOX"


def test_sandbox_memory_hands_out_the_same_state_per_key() -> None:
    memory = SandboxMemory()
    assert memory.edit_state("a") is memory.edit_state("a")
    assert memory.project_map("a") is memory.project_map("a")
    assert memory.edit_state("a") is not memory.edit_state("b")
    before = memory.edit_state("a")
    memory.drop("a")
    assert "a" not in memory
    assert memory.edit_state("a") is not before


def test_sandbox_memory_evicts_the_least_recently_used() -> None:
    memory = SandboxMemory(max_sandboxes=2)
    first = memory.edit_state("a")
    memory.edit_state("b")
    memory.edit_state("a")  # "b" is now the oldest
    memory.edit_state("c")
    assert len(memory) == 2
    assert "b" not in memory
    assert memory.edit_state("a") is first


def test_project_map_cache() -> None:
    cache = ProjectMapCache()
    assert cache.value is None
    cache.value = {"files": 3}
    cache.invalidate()
    assert cache.value is None
