"""Collecting artifacts: copying chosen workspace files out to the server, with their hashes.

Artifacts live in ``<state dir>/artifacts/<sandbox fingerprint>/<artifact id>``,
outside every slot, so they outlive the sandbox (by ``ARTIFACT_TTL_S`` once it is
emptied). They are read from the hostile workspace through the jail.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from app.experiments.core.errors import ProjectSourceError
from app.experiments.core.result import Result
from app.experiments.workspace.patterns import InvalidPattern, Matcher, compile_glob
from jail import Jail, JailError, PathInfo

MAX_PATTERNS = 20
MAX_FILES = 100
MAX_FILE_BYTES = 20 * 1_048_576
MAX_TOTAL_BYTES = 100 * 1_048_576
WALK_LIMIT = 50_000
MATCH_BUDGET_S = 10.0


class Artifact(BaseModel):
    artifact_id: str
    path: str
    size: int
    sha256: str
    uri: str
    parts: int = Field(
        default=1,
        description="Reads it takes: above 1, read `uri` + /parts/N for N from 0, in order.",
    )


class ArtifactList(Result):
    experiment_id: str
    artifacts: list[Artifact]
    skipped: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Collected:
    artifact_id: str
    path: str
    size: int
    sha256: str
    stored_as: str


def pattern_to_matcher(pattern: str) -> Matcher:
    """A workspace-relative glob (see ``compile_glob``), matched against whole paths."""
    if pattern.startswith("/") or ".." in pattern.split("/"):
        raise ProjectSourceError(f"{pattern!r} must be relative to the workspace, without '..'.")
    return compile_glob(pattern)


def collect(
    workspace: Path, patterns: list[str], store: Path, room: int = MAX_TOTAL_BYTES
) -> tuple[list[Collected], list[str]]:
    """Copy the regular files matching any pattern into ``store``, at most ``room`` bytes
    in all (the sandbox's artifact space left); returns (collected, skipped)."""
    if not patterns or len(patterns) > MAX_PATTERNS:
        raise ProjectSourceError(f"Give between 1 and {MAX_PATTERNS} patterns.")
    matchers = [pattern_to_matcher(p) for p in patterns]
    store.mkdir(parents=True, exist_ok=True, mode=0o700)
    collected: list[Collected] = []
    skipped: list[str] = []
    total = 0
    with Jail.open(workspace) as jail:
        try:
            entries = _matching_files(jail, matchers)
        except JailError as exc:
            if exc.code != "TOO_MANY_ENTRIES":
                raise
            raise ProjectSourceError(
                f"The workspace holds more than {WALK_LIMIT} entries; use narrower patterns."
            ) from exc
        for info in sorted(entries, key=lambda e: e.path):
            if len(collected) >= MAX_FILES:
                skipped.append(f"{info.path}: more than {MAX_FILES} files matched")
                continue
            if info.size > MAX_FILE_BYTES or total + info.size > MAX_TOTAL_BYTES:
                skipped.append(f"{info.path}: over the size limit")
                continue
            if total + info.size > room:
                skipped.append(f"{info.path}: over the artifact space left to your sandbox")
                continue
            try:
                data = jail.read_bytes(info.path, max_bytes=MAX_FILE_BYTES)
            except JailError as exc:
                skipped.append(f"{info.path}: {exc.message}")
                continue
            if total + len(data) > room:  # it grew since it was listed
                skipped.append(f"{info.path}: over the artifact space left to your sandbox")
                continue
            artifact_id = "art_" + uuid.uuid4().hex[:12]
            (store / artifact_id).write_bytes(data)
            total += len(data)
            collected.append(
                Collected(
                    artifact_id, info.path, len(data), hashlib.sha256(data).hexdigest(), artifact_id
                )
            )
    return collected, skipped


def _matching_files(jail: Jail, matchers: list[Matcher]) -> list[PathInfo]:
    # Each match is linear, but 20 globs of 500 characters against 50,000 long
    # paths is still minutes of a worker thread: the matching has a budget.
    deadline = time.monotonic() + MATCH_BUDGET_S
    entries = []
    for info in jail.walk(".", max_entries=WALK_LIMIT):
        if time.monotonic() > deadline:
            raise InvalidPattern(
                f"Matching the patterns against the workspace took over {MATCH_BUDGET_S:g} s; "
                "use fewer or simpler patterns (fewer '*')."
            )
        if info.kind == "file" and any(m.fullmatch(info.path) for m in matchers):
            entries.append(info)
    return entries
