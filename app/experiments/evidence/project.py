"""What a workspace holds: the facts run_tests detects from, and map_project's summary.

Read through the jail (the workspace is shared with a hostile container), bounded.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from pydantic import Field

from app.experiments.core.result import Result
from app.experiments.evidence import testing
from jail import Jail, JailError

WALK_LIMIT = 20_000
FACT_DEPTH = 3

LANGUAGES = {
    ".py": "Python",
    ".js": "JavaScript",
    ".mjs": "JavaScript",
    ".cjs": "JavaScript",
    ".ts": "TypeScript",
    ".tsx": "TypeScript",
    ".jsx": "JavaScript",
    ".rs": "Rust",
    ".go": "Go",
    ".java": "Java",
    ".kt": "Kotlin",
    ".rb": "Ruby",
    ".php": "PHP",
    ".c": "C",
    ".h": "C",
    ".cc": "C++",
    ".cpp": "C++",
    ".cs": "C#",
    ".sh": "Shell",
}
MANIFESTS = (
    "package.json",
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "requirements.txt",
    "Cargo.toml",
    "go.mod",
    "Makefile",
    "pom.xml",
    "build.gradle",
    "Gemfile",
    "composer.json",
)
ENTRY_POINTS = (
    "main.py",
    "__main__.py",
    "app.py",
    "manage.py",
    "index.js",
    "server.js",
    "main.js",
    "src/main.rs",
    "main.go",
    "src/index.ts",
    "src/index.js",
)


class ProjectMap(Result):
    files: int
    languages: dict[str, int] = Field(description="Files per language, most first.")
    manifests: list[str]
    test_runner: str | None = Field(description="What run_tests would use, if it can tell.")
    test_command: str | None = None
    entry_points: list[str]
    notes: list[str] = Field(default_factory=list)


def _paths(jail: Jail) -> tuple[list[str], bool]:
    paths: list[str] = []
    try:
        for info in jail.walk(".", max_entries=WALK_LIMIT):
            paths.append(info.path)
    except JailError as exc:
        if exc.code != "TOO_MANY_ENTRIES":
            raise
        return paths, True
    return paths, False


def facts(workspace: Path) -> testing.WorkspaceFacts:
    with Jail.open(workspace) as jail:
        paths, _ = _paths(jail)
        shallow = [p for p in paths if p.count("/") < FACT_DEPTH]

        def read(name: str) -> str | None:
            try:
                return jail.read_bytes(name, max_bytes=256 * 1024).decode("utf-8", "replace")
            except JailError:
                return None

        return testing.WorkspaceFacts.of(shallow, read)


def project_map(workspace: Path) -> ProjectMap:
    with Jail.open(workspace) as jail:
        paths, truncated = _paths(jail)
        package = None
        if "package.json" in paths:
            try:
                package = json.loads(jail.read_bytes("package.json", max_bytes=256 * 1024))
            except (JailError, ValueError):
                package = None
    files = [p for p in paths if "/node_modules/" not in f"/{p}" and "/.git/" not in f"/{p}"]
    languages = Counter(
        LANGUAGES[suffix] for p in files if (suffix := Path(p).suffix.lower()) in LANGUAGES
    )
    entry_points = [p for p in ENTRY_POINTS if p in files]
    if isinstance(package, dict):
        for key in ("main", "bin"):
            value = package.get(key)
            if isinstance(value, str):
                entry_points.append(value)
            elif isinstance(value, dict):
                entry_points.extend(v for v in value.values() if isinstance(v, str))
    plan = testing.detect(facts(workspace))
    notes = ["The workspace is large; the map covers its first entries only."] if truncated else []
    return ProjectMap(
        files=len(files),
        languages=dict(languages.most_common()),
        manifests=[m for m in MANIFESTS if m in files],
        test_runner=plan.runner if plan else None,
        test_command=plan.command if plan else None,
        entry_points=entry_points,
        notes=notes,
    )


def read_report(workspace: Path, report_path: str | None) -> bytes | None:
    """A test report file written by the runner in the container (through the jail), as
    bytes: the readers decode it as they parse."""
    if report_path is None:
        return None
    try:
        with Jail.open(workspace) as jail:
            return jail.read_bytes(report_path, max_bytes=20 * 1024 * 1024)
    except JailError:
        return None
