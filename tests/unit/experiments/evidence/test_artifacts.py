from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from app.errors import ServiceError
from app.experiments.evidence import artifacts
from app.experiments.evidence.artifacts import collect, pattern_to_matcher
from app.experiments.workspace.patterns import InvalidPattern


def test_globs() -> None:
    assert pattern_to_matcher("**/report.xml").fullmatch("a/b/report.xml")
    assert pattern_to_matcher("**/report.xml").fullmatch("report.xml")
    assert pattern_to_matcher("out/*.txt").fullmatch("out/a.txt")
    assert not pattern_to_matcher("out/*.txt").fullmatch("out/deep/a.txt")
    assert pattern_to_matcher("out/**").fullmatch("out/deep/a.txt")
    for bad in ("/etc/passwd", "../x", "a/../../b"):
        with pytest.raises(ServiceError):
            pattern_to_matcher(bad)


def test_collect_copies_hashes_and_never_follows_links_out(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    (ws / "out" / "a.txt").write_text("alpha")
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    os.symlink(secret, ws / "out" / "leak.txt")
    store = tmp_path / "store"
    collected, _ = collect(ws, ["out/*.txt"], store)
    assert [c.path for c in collected] == ["out/a.txt"]
    only = collected[0]
    assert only.sha256 == hashlib.sha256(b"alpha").hexdigest()
    assert (store / only.stored_as).read_text() == "alpha"
    assert all("host secret" not in p.read_text() for p in store.iterdir())


def test_collect_is_bounded(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(105):
        (ws / f"f{i:03d}.log").write_text("x")
    collected, skipped = collect(ws, ["*.log"], tmp_path / "store")
    assert len(collected) == 100
    assert len(skipped) == 5
    with pytest.raises(ServiceError):
        collect(ws, [], tmp_path / "store")


def test_matching_many_long_names_against_heavy_globs_has_a_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Linear per match, but 20 such globs cost about 10 ms per name (300 names, 3 s).
    # The whole match is timed here first, unbudgeted: the budget is a tenth of it and
    # the refusal must come within half of it, so the verdict is the same on a fast or
    # a busy machine (a budget checked only at the end would take the whole of it; one
    # name, a fortieth of it, is the most a working budget overruns by).
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(40):
        (ws / f"{i:03d}{'a' * 200}").write_text("x")
    heavy = ["*a" * 249 + "*b"] * 20
    monkeypatch.setattr(artifacts, "MATCH_BUDGET_S", float("inf"))
    started = time.perf_counter()
    assert collect(ws, heavy, tmp_path / "store") == ([], [])
    whole = time.perf_counter() - started

    monkeypatch.setattr(artifacts, "MATCH_BUDGET_S", whole / 10)
    started = time.perf_counter()
    refused = r"took over [\d.e-]+ s; use fewer or simpler patterns"
    with pytest.raises(InvalidPattern, match=refused):
        collect(ws, heavy, tmp_path / "store")
    assert time.perf_counter() - started < whole / 2
