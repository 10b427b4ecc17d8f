"""Lexical normalisation of sandbox-relative paths."""

from __future__ import annotations

import pytest

from jail import JailError
from jail._paths import normalize, split_parent


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a", "a"),
        (".", "."),
        ("./", "."),
        ("a/", "a"),
        ("a//b", "a/b"),
        ("./a/./b/.", "a/b"),
        ("a/b/..", "a"),
        ("a/../b", "b"),
        ("a/..", "."),
        ("%2e%2e", "%2e%2e"),
        ("..\\..", "..\\.."),
        ("\uff0e\uff0e\uff0fx", "\uff0e\uff0e\uff0fx"),
        ("...", "..."),
        ("é/ü", "é/ü"),
        ("x" * 255, "x" * 255),
    ],
)
def test_normalize(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("/", "PATH_OUTSIDE_SANDBOX"),
        ("/etc/passwd", "PATH_OUTSIDE_SANDBOX"),
        ("..", "PATH_OUTSIDE_SANDBOX"),
        ("a/../..", "PATH_OUTSIDE_SANDBOX"),
        ("./../a", "PATH_OUTSIDE_SANDBOX"),
        ("", "INVALID_PATH"),
        ("a\x00", "INVALID_PATH"),
        ("x" * 256, "INVALID_PATH"),
        ("é" * 128, "INVALID_PATH"),  # 256 bytes in UTF-8
        ("a/" * 2048, "INVALID_PATH"),
        ("\ud800", "INVALID_PATH"),
    ],
)
def test_normalize_refuses(raw: str, code: str) -> None:
    with pytest.raises(JailError) as excinfo:
        normalize(raw)
    assert excinfo.value.code == code


def test_non_string_is_invalid() -> None:
    with pytest.raises(JailError) as excinfo:
        normalize(b"a")  # type: ignore[arg-type]
    assert excinfo.value.code == "INVALID_PATH"


def test_long_paths_are_shown_truncated() -> None:
    with pytest.raises(JailError) as excinfo:
        normalize("a/" * 2048)
    assert len(excinfo.value.message) < 300


def test_split_parent() -> None:
    assert split_parent("a") == (".", "a")
    assert split_parent("a/b/c") == ("a/b", "c")
