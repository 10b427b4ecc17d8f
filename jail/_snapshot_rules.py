"""Which entries of a host project a snapshot copy leaves behind, and why.

Secrets are never copied, whatever the configuration. Build output is
skipped unless asked for. Callers may add their own glob patterns. Secret
and build names are matched case-insensitively (``.ENV`` is still ``.env``);
caller patterns are matched as given.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from jail.errors import JailError

Verdict = Literal["copy", "secret", "build", "excluded"]

# Files (and links) whose content is a credential, by base name.
SECRET_FILE_GLOBS = (
    ".env",
    ".env.*",
    "*.env",
    ".envrc",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "*.ppk",
    "*.kdbx",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".git-credentials",
    ".pypirc",
    ".htpasswd",
    ".dockercfg",
    ".vault-token",
    ".boto",
    ".s3cfg",
    "credentials",
    "credentials.json",
    "*credentials*.json",
    "client_secret*.json",
    "service-account*.json",
    "secrets.json",
    "secrets.yml",
    "secrets.yaml",
    "secrets.toml",
    "*.tfstate",
    "*.tfstate.*",
)
# Folders that hold nothing but credentials, by base name.
SECRET_DIR_NAMES = frozenset(
    {".ssh", ".aws", ".gnupg", ".kube", ".azure", ".password-store", ".gcloud"}
)
# Secrets recognisable only with their folder, matched on the end of the path.
# A repository's own config holds tokens often enough to count: remote URLs
# with credentials, and actions/checkout persists its token there as an
# http.extraheader. Git works without the file; the rest of .git is copied.
SECRET_PATH_GLOBS = (
    "*/.docker/config.json",
    "*/.config/gcloud",
    "*/.config/gh/hosts.yml",
    "*/.git/config",
    "*/.hg/hgrc",
)

BUILD_DIR_NAMES = frozenset(
    {
        "node_modules",
        "bower_components",
        "dist",
        "build",
        "target",
        ".venv",
        "venv",
        "__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        ".tox",
        ".nox",
        ".eggs",
        ".next",
        ".nuxt",
        ".svelte-kit",
        ".angular",
        ".turbo",
        ".parcel-cache",
        ".gradle",
        ".dart_tool",
        ".terraform",
        "htmlcov",
    }
)
BUILD_FILE_GLOBS = ("*.pyc", "*.pyo")
BUILD_DIR_GLOBS = ("*.egg-info",)

MAX_EXTRA_PATTERNS = 256
MAX_PATTERN_LENGTH = 1024


def _compile(globs: Sequence[str]) -> re.Pattern[str]:
    # One alternation instead of a loop of fnmatch calls: this runs per entry.
    return re.compile("|".join(fnmatch.translate(glob) for glob in globs) or "(?!)")


_SECRET_FILES = _compile(SECRET_FILE_GLOBS)
_SECRET_PATHS = _compile(SECRET_PATH_GLOBS)
_BUILD_FILES = _compile(BUILD_FILE_GLOBS)
_BUILD_DIRS = _compile(BUILD_DIR_GLOBS)


def is_secret(path: str, *, is_dir: bool) -> bool:
    """Whether the project-relative ``path`` names a secret (never copied)."""
    lowered = path.lower()
    name = lowered.rpartition("/")[2]
    if is_dir and name in SECRET_DIR_NAMES:
        return True
    if not is_dir and _SECRET_FILES.match(name):
        return True
    return _SECRET_PATHS.match("/" + lowered) is not None


def is_build_output(name: str, *, is_dir: bool) -> bool:
    lowered = name.lower()
    if is_dir:
        return lowered in BUILD_DIR_NAMES or _BUILD_DIRS.match(lowered) is not None
    return _BUILD_FILES.match(lowered) is not None


@dataclass(frozen=True)
class _Globs:
    """Caller patterns: base-name patterns and (with a ``/``) whole-path patterns."""

    names: re.Pattern[str]
    paths: re.Pattern[str]

    @classmethod
    def of(cls, globs: Sequence[str]) -> _Globs:
        return cls(
            names=_compile([g for g in globs if "/" not in g]),
            paths=_compile([g.strip("/") for g in globs if "/" in g]),
        )

    def match(self, path: str) -> bool:
        name = path.rpartition("/")[2]
        return self.names.match(name) is not None or self.paths.match(path) is not None


class SnapshotFilter:
    """Decides, entry by entry, what a snapshot copy leaves out.

    ``extra_excludes`` are glob patterns: one without ``/`` matches a base name
    (``*.log``); one with ``/`` matches the whole project-relative path, where
    ``*`` also crosses folders (``docs/*.pdf``); a trailing ``/`` limits a
    pattern to folders (``data/``).

    Raises:
        JailError: INVALID_EXCLUDE_PATTERN for empty, NUL-holding, over-long
            or too many patterns.
    """

    def __init__(
        self, extra_excludes: Sequence[str] = (), *, include_build_output: bool = False
    ) -> None:
        if len(extra_excludes) > MAX_EXTRA_PATTERNS:
            raise _bad_pattern(f"at most {MAX_EXTRA_PATTERNS} exclude patterns are allowed")
        for pattern in extra_excludes:
            if not isinstance(pattern, str) or not pattern.strip("/"):
                raise _bad_pattern("an exclude pattern is empty")
            if "\x00" in pattern or len(pattern) > MAX_PATTERN_LENGTH:
                raise _bad_pattern("an exclude pattern holds a NUL byte or is too long")
        self.include_build_output = include_build_output
        self._any = _Globs.of([p for p in extra_excludes if not p.endswith("/")])
        self._dirs = _Globs.of([p.rstrip("/") for p in extra_excludes if p.endswith("/")])

    def classify(self, path: str, *, is_dir: bool) -> Verdict:
        """The fate of the entry at project-relative ``path``; secrets win over all."""
        if is_secret(path, is_dir=is_dir):
            return "secret"
        if self._any.match(path) or (is_dir and self._dirs.match(path)):
            return "excluded"
        name = path.rpartition("/")[2]
        if not self.include_build_output and is_build_output(name, is_dir=is_dir):
            return "build"
        return "copy"


def _bad_pattern(reason: str) -> JailError:
    return JailError("INVALID_EXCLUDE_PATTERN", f"The snapshot was refused: {reason}.")
