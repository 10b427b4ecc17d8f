"""Which test runner a project uses, how to run it so that it leaves machine-readable results,
and what those results say. Pure: the caller lists the workspace and runs the command.

Detection takes the first of these that applies; the others are named in the plan's notes:

1. ``scripts.test`` in package.json names jest, vitest, mocha or ``node --test``;
2. a pytest configuration: ``[tool.pytest.ini_options]`` in pyproject.toml, pytest.ini,
   ``[pytest]`` in tox.ini or ``[tool:pytest]`` in setup.cfg;
3. Cargo.toml → ``cargo test``; go.mod → ``go test``;
4. vitest, jest or mocha among package.json's dependencies;
5. Python test files or a conftest.py → pytest, which runs unittest-style tests too; unittest
   when the config files name unittest and never pytest, or no file matches pytest's pattern;
6. files matching ``node --test``'s default patterns, no other JavaScript framework declared;
7. a ``test`` target in the Makefile → ``make test``;
8. any other ``scripts.test`` → ``npm test``.

The sandbox has no network, so a JavaScript runner counts only when node_modules is there.
The results of ``make test``, ``npm test`` or the caller's own command are recognised by shape.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import ClassVar

from app.experiments.evidence import readers as p
from app.experiments.evidence.readers import TestSummary

__all__ = ["TestPlan", "TestSummary", "WorkspaceFacts", "detect", "explain", "parse", "parse_any"]

REPORT_DIR = ".sandbox-reports"
FACT_FILES: tuple[str, ...] = ("package.json", "pyproject.toml", "setup.cfg", "pytest.ini")
FACT_FILES += ("tox.ini", "Cargo.toml", "go.mod", "Makefile")
MAX_FACT_CHARS = 256 * 1024


@dataclass(frozen=True)
class WorkspaceFacts:
    """What detection looks at: the workspace's relative paths (files and folders, depth ≤ 3)
    and the text of those of ``FACT_FILES`` that exist at its top level."""

    paths: frozenset[str]
    package_json: str | None = None
    pyproject_toml: str | None = None
    setup_cfg: str | None = None
    pytest_ini: str | None = None
    tox_ini: str | None = None
    cargo_toml: str | None = None
    go_mod: str | None = None
    makefile: str | None = None

    @classmethod
    def of(cls, paths: Iterable[str], read: Callable[[str], str | None]) -> WorkspaceFacts:
        """Collect the facts; ``read(name)`` returns a top-level file's text, or None."""
        present = frozenset(paths)
        texts: dict[str, str | None] = {}
        for name in FACT_FILES:
            text = read(name) if name in present else None
            texts[name.lower().replace(".", "_")] = text[:MAX_FACT_CHARS] if text else text
        return cls(present, **texts)


@dataclass(frozen=True)
class TestPlan:
    """How to run the tests in /workspace; ``notes[0]`` says why this runner."""

    __test__: ClassVar[bool] = False  # not a pytest test class, despite the name

    runner: str
    command: str
    report_path: str | None = None
    notes: list[str] = field(default_factory=list)


def detect(files: WorkspaceFacts) -> TestPlan | None:
    """The runner to use and a command that makes it leave readable results, or None.

    The report, if any, is written under ``REPORT_DIR``, which the caller keeps out of diffs;
    the command deletes the previous one first, so a stale report is never read.
    """
    plans, notes = _plans(files)
    if not plans:
        return None
    others = "; ".join(f"{plan.runner} ({plan.notes[0]})" for plan in plans[1:])
    also = [f"also found {others}: pass a command to run those"] if others else []
    return replace(plans[0], notes=[*plans[0].notes, *notes, *also])


def explain(files: WorkspaceFacts) -> list[str]:
    """Why runners the project seems to use were passed over (for when ``detect`` is None)."""
    return _plans(files)[1]


def parse(
    runner: str, stdout: str, stderr: str, report: bytes | str | None, exit_code: int | None
) -> TestSummary:
    """Read a run of ``runner`` (a ``TestPlan.runner``); never raises, whatever the input."""
    readers = p.READERS.get(runner)
    if readers is None:
        summary = parse_any(stdout, stderr, exit_code)
        if summary.detected and summary.runner != runner:
            summary.notes.insert(0, f"{runner} ran {summary.runner} (recognised by its output)")
        return summary
    notes: list[str] = []
    inputs = p.prepare(stdout, stderr, report, notes)
    tally = p.first_reading(readers, inputs, notes, fallback=True)
    return p.summarize(tally, notes, exit_code, runner)


def parse_any(stdout: str, stderr: str, exit_code: int | None) -> TestSummary:
    """Read the output of any command by recognising a known runner's format in it."""
    notes: list[str] = []
    tally = p.first_reading(p.SNIFFERS, p.prepare(stdout, stderr, None, notes), notes)
    return p.summarize(tally, notes, exit_code, None)


_NPM_DEFAULT_TEST = 'echo "Error: no test specified" && exit 1'
_JS_FRAMEWORKS = frozenset({"jest", "vitest", "mocha", "ava", "tap", "tape", "jasmine", "uvu"})
_SCRIPT_RUNNER = re.compile(r"(?:^|[\s;&|(/])(jest|vitest|mocha)\b|\bnode\b[^;&|]*\s--test\b")
_PY_TESTS = re.compile(r"(?:^|/)(?:test[^/]*|[^/]*_test)\.py$")
_PYTEST_FILES = re.compile(r"(?:^|/)(?:test_[^/]*|[^/]*_test)\.py$")
_NODE_TESTS = re.compile(
    r"(?:^|/)(?:[^/]*[.\-_]test|test-[^/]*|test)\.[cm]?js$|(?:^|/)test/.+\.[cm]?js$"
)
_UNUSED_DIRS = frozenset({"node_modules", "venv", "site-packages", "__pycache__", "target"})
_NODE_COMMAND = "node --test --test-reporter=tap"
# Flags in the project's own script that would take the results away from us.
_DROPPED = re.compile(
    r"--(?:watch\w*|reporters?|json|outputFile\S*|test-reporter\S*|test)(?:=.*)?$"
)
_DROPPED_WITH_VALUE = frozenset({"--reporter", "--reporters", "-R", "--outputFile"})


@dataclass(frozen=True)
class _Package:
    script: str
    deps: frozenset[str]


def _plans(files: WorkspaceFacts) -> tuple[list[TestPlan], list[str]]:
    notes: list[str] = []
    paths = [path for path in files.paths if not any(map(_unused, path.split("/")))]
    pkg = _package(files.package_json, notes)
    named = _SCRIPT_RUNNER.search(pkg.script) if pkg else None
    found: list[TestPlan | None] = []
    if pkg and named:
        why = f"package.json scripts.test runs {named[1] or 'node --test'}"
        found.append(_js(named[1] or "node", files, pkg, why, notes))
    found.append(_pytest_config(files))
    if "Cargo.toml" in files.paths:
        cargo = "cargo test --no-fail-fast --offline"  # offline: fail at once, not after retries
        found.append(TestPlan("cargo", cargo, None, ["Cargo.toml"]))
    if "go.mod" in files.paths:
        found.append(TestPlan("go", "go test -json ./...", None, ["go.mod"]))
    for runner in ("vitest", "jest", "mocha"):
        if pkg and runner in pkg.deps:
            found.append(_js(runner, files, pkg, f"package.json depends on {runner}", notes))
    found.append(_python_tests(files, paths))
    if not (pkg and pkg.deps & _JS_FRAMEWORKS) and any(map(_NODE_TESTS.search, paths)):
        found.append(TestPlan("node", _NODE_COMMAND, None, ["files match node --test's patterns"]))
    if files.makefile and re.search(r"(?m)^test\s*:(?!=)", files.makefile):
        found.append(TestPlan("make", "make test", None, ["the Makefile has a test target"]))
    if pkg and pkg.script and not named:
        why = f"package.json scripts.test runs `{pkg.script[:80]}`, a runner not known here"
        found.append(TestPlan("npm", "npm test", None, [why]))
    plans: list[TestPlan] = []
    for plan in found:
        if plan and all(plan.runner != other.runner for other in plans):
            plans.append(plan)
    return plans, list(dict.fromkeys(notes))


def _unused(part: str) -> bool:
    return part.startswith(".") or part in _UNUSED_DIRS


def _package(text: str | None, notes: list[str]) -> _Package | None:
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        notes.append("package.json is not a JSON object; ignored it")
        return None
    scripts = data.get("scripts")
    script = scripts.get("test") if isinstance(scripts, dict) else None
    script = script.strip()[:1000] if isinstance(script, str) else ""  # bounds the regexes
    deps = [data.get(key) for key in ("dependencies", "devDependencies")]
    names = frozenset(name for dep in deps if isinstance(dep, dict) for name in dep)
    return _Package("" if script == _NPM_DEFAULT_TEST else script, names)


def _js(
    runner: str, files: WorkspaceFacts, pkg: _Package, reason: str, notes: list[str]
) -> TestPlan | None:
    if runner != "node" and not _installed(runner, files.paths, notes):
        return None
    env, args = _script_args(pkg.script, runner) or ("", "")
    why = [reason]
    if runner == "node":
        return TestPlan(runner, f"{env}{_NODE_COMMAND}{args}", None, why)
    if runner == "mocha":
        return TestPlan(runner, f"{env}npx --no-install mocha{args} --reporter json", None, why)
    report = f"{REPORT_DIR}/{runner}.json"
    npx = f"mkdir -p {REPORT_DIR} && rm -f {report} && {env}npx --no-install"
    if runner == "jest":
        return TestPlan(runner, f"{npx} jest{args} --json --outputFile={report}", report, why)
    # vitest resolves a relative outputFile against its --root, which a script may move.
    flags = f'--reporter=default --reporter=json --outputFile.json="$PWD/{report}"'
    return TestPlan(runner, f"{npx} vitest run{args} {flags}", report, why)


def _installed(runner: str, paths: frozenset[str], notes: list[str]) -> bool:
    if "node_modules" not in paths and not any(p.startswith("node_modules/") for p in paths):
        notes.append(
            f"{runner} is named in package.json but node_modules is missing, and the sandbox "
            "has no network to install it: add node_modules to the project or pass a command"
        )
        return False
    listed = any(p.startswith("node_modules/.bin/") for p in paths)
    if listed and f"node_modules/.bin/{runner}" not in paths:
        notes.append(f"{runner} is named in package.json but node_modules/.bin has no {runner}")
        return False
    return True


def _script_args(script: str, runner: str) -> tuple[str, str] | None:
    """``VAR=x [npx] runner args`` → ``("VAR=x ", " args")``, re-quoted; None if not so plain."""
    if re.search(r"[;&|<>`$()\\\n]", script):
        return None
    try:
        words = shlex.split(script)
    except ValueError:
        return None
    env = []
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
        env.append(words.pop(0))
    words = words[1:] if words[:1] == ["npx"] else words
    if words[:1] != [runner] or (runner == "node" and "--test" not in words):
        return None
    args = words[2:] if runner == "vitest" and words[1:2] in (["run"], ["watch"]) else words[1:]
    kept = [
        word
        for word, before in zip(args, ["", *args], strict=False)
        if not _DROPPED.match(word)
        and word not in _DROPPED_WITH_VALUE
        and before not in _DROPPED_WITH_VALUE
    ]
    return "".join(f"{shlex.quote(w)} " for w in env), "".join(f" {shlex.quote(w)}" for w in kept)


def _pytest_config(files: WorkspaceFacts) -> TestPlan | None:
    if "pytest.ini" in files.paths:
        return _pytest("pytest.ini")
    sections = (
        (files.pyproject_toml, r"(?m)^\[tool\.pytest\.ini_options\]", "pyproject.toml"),
        (files.setup_cfg, r"(?m)^\[tool:pytest\]", "setup.cfg"),
        (files.tox_ini, r"(?m)^\[pytest\]", "tox.ini"),
    )
    for text, section, name in sections:
        if text and re.search(section, text):
            return _pytest(f"pytest is configured in {name}")
    return None


def _pytest(why: str) -> TestPlan:
    report = f"{REPORT_DIR}/pytest.xml"
    # xunit1 records each test's file, which turns the report's names into pytest node ids.
    command = (
        f"mkdir -p {REPORT_DIR} && rm -f {report} && python3 -m pytest -q -p no:cacheprovider "
        f"-o junit_family=xunit1 --junitxml={report}"
    )
    return TestPlan("pytest", command, report, [why])


def _python_tests(files: WorkspaceFacts, paths: list[str]) -> TestPlan | None:
    tests = [path for path in paths if _PY_TESTS.search(path)]
    conftest = any(path.rpartition("/")[2] == "conftest.py" for path in paths)
    if not tests and not conftest:
        return None
    configs = (files.pyproject_toml, files.setup_cfg, files.tox_ini, files.makefile)
    config = "\n".join(text for text in configs if text)
    pytest_files = conftest or any(map(_PYTEST_FILES.search, tests))
    if "pytest" in config or (pytest_files and "unittest" not in config):
        return _pytest("conftest.py" if conftest else "Python test files")
    command = "python3 -m unittest discover -v"
    if all("/" in path for path in tests):
        for top in ("tests", "test"):
            if any(p.startswith(f"{top}/") for p in tests) and f"{top}/__init__.py" not in paths:
                # Since Python 3.11 discovery skips folders that aren't packages: start inside.
                command += f" -s {top}"
                break
    return TestPlan("unittest", command, None, ["Python test files for unittest"])
