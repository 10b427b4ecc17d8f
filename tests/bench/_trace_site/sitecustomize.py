"""Loaded by the server under ``trace_one_command.py`` (on PYTHONPATH): a profiler that,
once armed (SIGUSR1), follows the next request into ``/mcp`` through every task and
thread that inherits its context, and writes what it crossed on SIGUSR2.

Only our own packages are recorded (app, auth, pool, jail); each call event records the
module, and the chain of our modules on the stack at that moment (consecutive frames of
one module collapsed): its length less one is the hops that call is deep.
"""

from __future__ import annotations

import contextvars
import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

_ROOT = Path(os.environ["SMCP_TRACE_ROOT"]).resolve()
_OURS = tuple(str(_ROOT / p) + os.sep for p in ("app", "auth", "pool", "jail"))
_ENTRY = str(_ROOT / "app" / "mcp" / "transport.py")
_OUT = os.environ["SMCP_TRACE_OUT"]
_following: contextvars.ContextVar[bool] = contextvars.ContextVar("smcp_trace", default=False)
_armed = False
_modules: dict[str, int] = {}
_edges: set[tuple[str, str]] = set()
_deepest: list[str] = []


# The process's entry: every task's stack ends in the event loop they started, which is
# no caller of the request's code.
_ENTRY_MODULES = {str(_ROOT / "app" / "__main__.py"), str(_ROOT / "app" / "cli.py")}


def _module(filename: str) -> str | None:
    if not filename.startswith(_OURS) or filename in _ENTRY_MODULES:
        return None
    return str(Path(filename).relative_to(_ROOT).with_suffix("")).replace(os.sep, ".")


def _chain(frame: FrameType | None) -> list[str]:
    chain: list[str] = []
    while frame is not None:
        module = _module(frame.f_code.co_filename)
        if module is not None and (not chain or chain[-1] != module):
            chain.append(module)
        frame = frame.f_back
    return chain[::-1]


def _profile(frame: FrameType, event: str, arg: Any) -> None:
    global _armed, _deepest
    if event != "call":
        return
    filename = frame.f_code.co_filename
    if _armed and filename == _ENTRY and frame.f_code.co_name == "__call__":
        _armed = False
        _following.set(True)
    if not _following.get():
        return
    module = _module(filename)
    if module is None:
        return
    _modules[module] = _modules.get(module, 0) + 1
    caller = frame.f_back
    while caller is not None and _module(caller.f_code.co_filename) is None:
        caller = caller.f_back
    if caller is not None:
        calling = _module(caller.f_code.co_filename)
        if calling is not None and calling != module:
            _edges.add((calling, module))
    chain = _chain(frame)
    if len(chain) > len(_deepest):
        _deepest = chain


def _arm(*_: object) -> None:
    global _armed
    _modules.clear()
    _edges.clear()
    _deepest.clear()
    _armed = True


def _write(*_: object) -> None:
    report = {"modules": _modules, "edges": sorted(_edges), "deepest": _deepest}
    Path(_OUT).write_text(json.dumps(report))


signal.signal(signal.SIGUSR1, _arm)
signal.signal(signal.SIGUSR2, _write)
sys.setprofile(_profile)
threading.setprofile(_profile)
