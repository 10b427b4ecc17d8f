"""``in_workspace``: the one path by which a file tool works on a workspace folder."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from app.mcp.tools.common import ToolDeps, in_workspace
from jail import CallContext, SandboxMemory, new_call_context


class Manager:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.asked: list[tuple[str, str]] = []

    async def workspace(self, call: CallContext, experiment_id: str) -> Path:
        self.asked.append((call.sandbox_key, experiment_id))
        return self.root / experiment_id


async def test_the_work_gets_the_experiment_s_workspace_in_a_thread_of_the_call_s_share(
    tmp_path: Path,
) -> None:
    threads: list[str] = []

    async def in_thread(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        threads.append(func.__name__)  # the sandbox's share, not the loop's executor
        return func(*args, **kwargs)

    call = new_call_context(
        SandboxMemory(), "key-1", request_id="r", slot_root=tmp_path, in_thread=in_thread
    )
    manager = Manager(tmp_path)
    deps = ToolDeps(runner=cast(Any, None), manager=cast(Any, manager), status=cast(Any, None))

    def work(workspace: Path, word: str, *, times: int) -> tuple[Path, str, str]:
        return workspace, word * times, threading.current_thread().name

    found, text, _ = await in_workspace(deps, call, "exp_1", work, "ab", times=2)
    assert (found, text) == (tmp_path / "exp_1", "abab")
    assert manager.asked == [("key-1", "exp_1")]
    assert threads == ["work"]
