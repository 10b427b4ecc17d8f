"""What the server remembers about each sandbox between calls (in memory only).

Two things: the edit state (the content hash of each file as the agent last
saw it) and the cached project map. ``SandboxMemory`` hands out the same pair
for the same sandbox key, evicts the least recently used sandbox beyond its
bound, and forgets a sandbox when it is emptied (``drop``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from jail._paths import normalize, quote
from jail.errors import JailError

DEFAULT_MAX_TRACKED_FILES = 4096
DEFAULT_MAX_SANDBOXES = 1024


class EditState:
    """Content hashes of files as last read in one sandbox, to refuse stale edits.

    An edit requires a prior read: ``check_fresh`` on a file the agent never
    read (or whose entry was evicted) raises EDIT_WITHOUT_READ, as an edit
    aimed at unseen content is a guess. Tools that write a whole file should
    ``record_read`` the new content's hash too, since the agent knows it.

    Paths are normalised, so ``a/./b`` and ``a/b`` share an entry. Bounded:
    past ``max_entries`` the least recently touched file is forgotten.
    Thread-safe.
    """

    def __init__(self, *, max_entries: int = DEFAULT_MAX_TRACKED_FILES) -> None:
        self._max_entries = max_entries
        self._hashes: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._hashes)

    def record_read(self, path: str, sha256: str) -> None:
        """Remember ``sha256`` as the content the agent has seen at ``path``."""
        key = normalize(path)
        with self._lock:
            self._hashes[key] = sha256
            self._hashes.move_to_end(key)
            while len(self._hashes) > self._max_entries:
                self._hashes.popitem(last=False)

    def check_fresh(self, path: str, current_sha256: str) -> None:
        """Raise unless ``current_sha256`` is what the agent last read at ``path``.

        Raises:
            JailError: EDIT_WITHOUT_READ if never read, STALE_EDIT if changed since.
        """
        key = normalize(path)
        with self._lock:
            seen = self._hashes.get(key)
        if seen is None:
            raise JailError(
                "EDIT_WITHOUT_READ",
                f"{quote(key)} has not been read in this sandbox yet; read it, then edit it.",
                {"path": key},
            )
        if seen != current_sha256:
            raise JailError(
                "STALE_EDIT",
                f"{quote(key)} changed since it was last read; read it again, then redo the edit.",
                {"path": key},
            )

    def forget(self, path: str) -> None:
        """Forget ``path`` and everything beneath it (after a remove or a rename)."""
        key = normalize(path)
        prefix = "" if key == "." else key + "/"
        with self._lock:
            for known in [k for k in self._hashes if k == key or k.startswith(prefix)]:
                del self._hashes[known]

    def clear(self) -> None:
        with self._lock:
            self._hashes.clear()


class ProjectMapCache:
    """The sandbox's project map, computed by the app on demand; None when stale."""

    def __init__(self) -> None:
        self.value: dict[str, object] | None = None

    def invalidate(self) -> None:
        self.value = None


class SandboxMemory:
    """Per-sandbox ``EditState`` and ``ProjectMapCache``, keyed by sandbox key.

    Bounded: beyond ``max_sandboxes`` the least recently used sandbox is
    forgotten, which only costs its agent a re-read before the next edit.
    Thread-safe.
    """

    def __init__(
        self,
        *,
        max_sandboxes: int = DEFAULT_MAX_SANDBOXES,
        max_files_per_sandbox: int = DEFAULT_MAX_TRACKED_FILES,
    ) -> None:
        self._max_sandboxes = max_sandboxes
        self._max_files = max_files_per_sandbox
        self._entries: OrderedDict[str, tuple[EditState, ProjectMapCache]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, sandbox_key: object) -> bool:
        return sandbox_key in self._entries

    def edit_state(self, sandbox_key: str) -> EditState:
        return self.get(sandbox_key)[0]

    def project_map(self, sandbox_key: str) -> ProjectMapCache:
        return self.get(sandbox_key)[1]

    def drop(self, sandbox_key: str) -> None:
        """Forget everything about a sandbox (called when it is emptied)."""
        with self._lock:
            self._entries.pop(sandbox_key, None)

    def get(self, sandbox_key: str) -> tuple[EditState, ProjectMapCache]:
        """The sandbox's edit state and project map, created on first use."""
        with self._lock:
            entry = self._entries.get(sandbox_key)
            if entry is None:
                entry = (EditState(max_entries=self._max_files), ProjectMapCache())
                self._entries[sandbox_key] = entry
                while len(self._entries) > self._max_sandboxes:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(sandbox_key)
            return entry
