"""The documentation stays true to the repository: every setting has its row in
docs/configuration.md (and no row names a setting that is gone), every relative
link resolves (the file, and the heading it points at), and every repository
path a page names in backticks exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.settings import ENV_PREFIX, variables

ROOT = Path(__file__).parents[3]
CONFIGURATION = ROOT / "docs" / "configuration.md"
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*/README.md")]
)

ROW = re.compile(r"^\| `(SANDBOX_MCP_[A-Z0-9_]+)` \|", re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# A path into the repository, as pages name them: `tests/e2e/test_demo_*.py`.
REPO_PATH = re.compile(r"(app|auth|pool|jail|tests|docs|deploy|examples|\.ci)/[\w./*-]*")
# Names the server ignores: the test suite's (TEST_*) and .ci/run's (CI_*), as app.settings does.
NOT_SETTINGS = re.compile(rf"{ENV_PREFIX}(TEST|CI)(_\w*)?")


def documented_settings() -> list[str]:
    return ROW.findall(CONFIGURATION.read_text())


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_every_setting_has_a_row_in_the_configuration_page() -> None:
    expected = set(variables())
    assert sorted(expected - set(documented_settings())) == []


def test_no_row_names_a_setting_that_does_not_exist() -> None:
    expected = set(variables())
    assert sorted(set(documented_settings()) - expected) == []


def test_the_configuration_table_is_alphabetical_with_one_row_each() -> None:
    rows = documented_settings()
    assert rows == sorted(set(rows))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_variable_a_page_names_is_a_setting(page: Path) -> None:
    known = set(variables())
    named = set(re.findall(rf"{ENV_PREFIX}[A-Z0-9_]*[A-Z0-9]", page.read_text()))
    assert sorted(n for n in named - known if not NOT_SETTINGS.fullmatch(n)) == []


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:: not ours to check offline
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        missing_file = not file.exists() or not file.is_relative_to(ROOT)
        if missing_file or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_repository_path_a_page_names_exists(page: Path) -> None:
    missing = []
    for span in CODE_SPAN.findall(page.read_text()):
        for match in REPO_PATH.finditer(span):
            if match.start() > 0 and span[match.start() - 1] not in " (=":
                continue  # part of a longer path or URL, not a repository path
            named = match.group(0).rstrip(".")
            if not any(ROOT.glob(named)) and not (ROOT / named).exists():
                missing.append(named)
    assert missing == []
