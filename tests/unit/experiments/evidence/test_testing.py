"""Test-runner detection and result reading, on recorded outputs of the real runners.

The files in fixtures/test_outputs were produced by the runners themselves (see the README
there), so these tests need no Docker.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from app.experiments.evidence import readers as test_readers
from app.experiments.evidence.testing import (
    REPORT_DIR,
    TestPlan,
    TestSummary,
    WorkspaceFacts,
    detect,
    explain,
    parse,
    parse_any,
)

FIXTURES = Path(__file__).parent / "fixtures" / "test_outputs"
PYTEST_CMD = (
    f"mkdir -p {REPORT_DIR} && rm -f {REPORT_DIR}/pytest.xml && python3 -m pytest -q "
    f"-p no:cacheprovider -o junit_family=xunit1 --junitxml={REPORT_DIR}/pytest.xml"
)


def fixture(name: str | None) -> str:
    return (FIXTURES / name).read_text() if name else ""


def facts(*paths: str, **texts: str | None) -> WorkspaceFacts:
    return WorkspaceFacts(frozenset(paths), **texts)


def package(script: str | None = None, **deps: str) -> str:
    data: dict[str, object] = {"name": "demo", "devDependencies": deps}
    if script is not None:
        data["scripts"] = {"test": script}
    return json.dumps(data)


# --- detection -------------------------------------------------------------------------------

DETECTION = [
    pytest.param(
        facts("pyproject.toml", "src/app.py", pyproject_toml="[tool.pytest.ini_options]\n"),
        "pytest",
        PYTEST_CMD,
        id="pyproject-pytest-section",
    ),
    pytest.param(facts("pytest.ini", "app.py"), "pytest", PYTEST_CMD, id="pytest-ini"),
    pytest.param(
        facts("setup.cfg", setup_cfg="[metadata]\nname = x\n[tool:pytest]\naddopts = -q\n"),
        "pytest",
        PYTEST_CMD,
        id="setup-cfg-pytest-section",
    ),
    pytest.param(facts("tests", "tests/test_a.py"), "pytest", PYTEST_CMD, id="tests-folder"),
    pytest.param(facts("pkg/conftest.py", "pkg/a.py"), "pytest", PYTEST_CMD, id="conftest"),
    pytest.param(
        facts("tests/test_a.py", "Makefile", makefile="check:\n\tpython3 -m unittest\n"),
        "unittest",
        "python3 -m unittest discover -v -s tests",
        id="unittest-named-in-makefile",
    ),
    pytest.param(
        facts("tests/__init__.py", "tests/testcore.py"),
        "unittest",
        "python3 -m unittest discover -v",
        id="unittest-only-pattern",
    ),
    pytest.param(
        facts(
            "package.json",
            "node_modules",
            "node_modules/.bin/jest",
            package_json=package(
                "NODE_OPTIONS=--experimental-vm-modules jest --watch -i", jest="*"
            ),
        ),
        "jest",
        f"mkdir -p {REPORT_DIR} && rm -f {REPORT_DIR}/jest.json && "
        "NODE_OPTIONS=--experimental-vm-modules npx --no-install jest -i "
        f"--json --outputFile={REPORT_DIR}/jest.json",
        id="jest-script-with-env-and-watch",
    ),
    pytest.param(
        facts("package.json", "node_modules", package_json=package(None, vitest="^1")),
        "vitest",
        f"mkdir -p {REPORT_DIR} && rm -f {REPORT_DIR}/vitest.json && npx --no-install vitest run"
        f' --reporter=default --reporter=json --outputFile.json="$PWD/{REPORT_DIR}/vitest.json"',
        id="vitest-dependency",
    ),
    pytest.param(
        facts(
            "package.json",
            "node_modules",
            package_json=package("mocha --recursive 'spec/**/*.js' -R spec", mocha="*"),
        ),
        "mocha",
        "npx --no-install mocha --recursive 'spec/**/*.js' --reporter json",
        id="mocha-script-args-kept-reporter-dropped",
    ),
    pytest.param(
        facts("package.json", "node_modules", package_json=package("eslint . && mocha", mocha="*")),
        "mocha",
        "npx --no-install mocha --reporter json",
        id="mocha-in-a-compound-script",
    ),
    pytest.param(
        facts("package.json", "test/a.test.js", package_json=package("node --test test/")),
        "node",
        "node --test --test-reporter=tap test/",
        id="node-test-script",
    ),
    pytest.param(
        facts("lib/sum.mjs", "lib/sum.test.mjs"),
        "node",
        "node --test --test-reporter=tap",
        id="node-test-files",
    ),
    pytest.param(
        facts("Cargo.toml", "src/lib.rs"),
        "cargo",
        "cargo test --no-fail-fast --offline",
        id="cargo",
    ),
    pytest.param(facts("go.mod", "x_test.go"), "go", "go test -json ./...", id="go"),
    pytest.param(
        facts("Makefile", makefile="CC = gcc\n\ntest: build\n\t./run-tests\n"),
        "make",
        "make test",
        id="make-test-target",
    ),
    pytest.param(
        facts("package.json", package_json=package("ava --verbose", ava="*")),
        "npm",
        "npm test",
        id="unknown-script",
    ),
]


@pytest.mark.parametrize(("workspace", "runner", "command"), DETECTION)
def test_detect(workspace: WorkspaceFacts, runner: str, command: str) -> None:
    plan = detect(workspace)

    assert plan is not None
    assert (plan.runner, plan.command) == (runner, command)
    assert plan.notes, "the first note says why this runner"
    if plan.report_path is not None:
        assert plan.report_path.startswith(f"{REPORT_DIR}/")
        assert f"rm -f {plan.report_path}" in plan.command


@pytest.mark.parametrize(
    "workspace",
    [
        pytest.param(facts(), id="empty"),
        pytest.param(facts("README.md", "src/main.c"), id="no-tests"),
        pytest.param(
            facts("Makefile", makefile="test := 1\nall:\n\tcc x.c\n"), id="make-no-target"
        ),
        pytest.param(facts("package.json", package_json=package()), id="npm-default-script"),
        pytest.param(facts(".venv/lib/test_x.py", "node_modules/a/test.js"), id="vendored-only"),
    ],
)
def test_detect_nothing(workspace: WorkspaceFacts) -> None:
    assert detect(workspace) is None


def test_a_js_runner_without_node_modules_is_passed_over_with_the_reason() -> None:
    workspace = facts("package.json", "test/a.test.js", package_json=package("jest", jest="*"))

    assert detect(workspace) is None  # and not node --test on jest-style files
    assert any("node_modules is missing" in note for note in explain(workspace))

    with_python = facts(*workspace.paths, "tests/test_a.py", package_json=workspace.package_json)
    plan = detect(with_python)
    assert plan is not None
    assert plan.runner == "pytest"
    assert any("node_modules is missing" in note for note in plan.notes)


def test_a_js_runner_missing_from_node_modules_bin_is_passed_over() -> None:
    workspace = facts(
        "package.json",
        "node_modules/.bin/eslint",
        package_json=package("vitest run", vitest="*"),
    )

    assert detect(workspace) is None
    assert explain(workspace) == [
        "vitest is named in package.json but node_modules/.bin has no vitest"
    ]


def test_the_script_outranks_configs_and_the_others_are_named() -> None:
    workspace = facts(
        "package.json",
        "node_modules",
        "pyproject.toml",
        "tests/test_a.py",
        "go.mod",
        package_json=package("jest", jest="*"),
        pyproject_toml="[tool.pytest.ini_options]\n",
    )

    plan = detect(workspace)

    assert plan is not None
    assert plan.runner == "jest"
    also = plan.notes[-1]
    assert also.startswith("also found pytest (pytest is configured in pyproject.toml); go (")


def test_a_broken_package_json_is_noted_and_other_runners_still_found() -> None:
    workspace = facts("package.json", "tests/test_a.py", package_json="{not json")

    plan = detect(workspace)

    assert plan is not None
    assert plan.runner == "pytest"
    assert "package.json is not a JSON object; ignored it" in plan.notes


def test_workspace_facts_of_reads_only_the_known_files_present() -> None:
    read: list[str] = []

    def reader(name: str) -> str | None:
        read.append(name)
        return "x" * (2 * 1024 * 1024) if name == "Makefile" else "[tool.pytest.ini_options]"

    workspace = WorkspaceFacts.of(["pyproject.toml", "Makefile", "src", "src/a.py"], reader)

    assert sorted(read) == ["Makefile", "pyproject.toml"]
    assert workspace.pyproject_toml == "[tool.pytest.ini_options]"
    assert workspace.makefile is not None
    assert len(workspace.makefile) == 256 * 1024
    assert workspace.package_json is None
    assert "src/a.py" in workspace.paths


def test_plans_and_summaries_are_not_collected_as_tests() -> None:
    assert TestPlan.__test__ is False
    assert TestSummary.__test__ is False


# --- reading the real runners' outputs --------------------------------------------------------

PYTEST_FAILING = [
    "tests/test_more.py::MathCase::test_raises_error",
    "tests/test_more.py::MathCase::test_sub_fails",
    "tests/test_more.py::MathCase::test_subtests",
    "tests/test_sample.py::test_fails",
    "tests/test_sample.py::test_error",
    "tests/test_sample.py::test_param[2]",
    "tests/test_sample.py::TestThing::test_method_fails",
    "tests/test_sample.py::UnitCase::test_b",
]
NODE_FAILING = [
    "subtracts badly",
    'suite A > inner "fails" # with hash',
    "suite A > nested > deep fails",
    "async rejects",
]
JEST_FAILING = [
    "jt/math.test.js > math > subtracts badly",
    "jt/math.test.js > math > nested > deep fails",
    "jt/other.test.js > async rejects",
    "jt/broken.test.js",
]
VITEST_FAILING = [
    "vt/broken.test.js",
    "vt/math.test.js > math > subtracts badly",
    "vt/math.test.js > math > nested > deep fails",
    "vt/other.test.js > async rejects",
]
MOCHA_FAILING = [
    "math subtracts badly",
    "math nested deep fails",
    'math hooks "before all" hook for "not reached"',
]
GO_FAILING = [
    "example.com/demo.TestSubBad",
    "example.com/demo.TestTable/n=2",
    "example.com/demo/broken",
]

# runner, stdout, stderr, report, exit code, (passed, failed, skipped, errors), failing tests
RECORDED = [
    pytest.param(
        "pytest",
        "pytest_stdout.txt",
        None,
        "pytest_junit.xml",
        1,
        (6, 7, 4, 1),
        PYTEST_FAILING,
        id="pytest-junit",
    ),
    pytest.param(
        "pytest",
        "pytest_stdout.txt",
        None,
        None,
        1,
        (6, 7, 4, 1),
        [*PYTEST_FAILING[:4], *PYTEST_FAILING[5:], PYTEST_FAILING[4]],
        id="pytest-text-when-no-report",
    ),
    pytest.param(
        "pytest",
        "pytest_collection_error_stdout.txt",
        None,
        "pytest_collection_error.xml",
        2,
        (0, 0, 0, 1),
        ["tests/test_broken.py"],
        id="pytest-collection-error",
    ),
    pytest.param(
        "unittest",
        None,
        "unittest_stderr.txt",
        None,
        1,
        (2, 3, 2, 1),
        [
            "tests.test_more.MathCase.test_raises_error",
            "tests.test_more.MathCase.test_sub_fails",
            "tests.test_more.MathCase.test_subtests (i=1)",
            "tests.test_sample.UnitCase.test_b",
        ],
        id="unittest-verbose",
    ),
    pytest.param(
        "node", "node18_tap.txt", None, None, 1, (3, 4, 2, 0), NODE_FAILING, id="node18-tap"
    ),
    pytest.param(
        "node", "node22_tap.txt", None, None, 1, (3, 4, 2, 0), NODE_FAILING, id="node22-tap"
    ),
    pytest.param(
        "node",
        "node22_spec.txt",
        None,
        None,
        1,
        (3, 4, 2, 0),
        ["subtracts badly", 'inner "fails" # with hash', "deep fails", "async rejects"],
        id="node22-spec-text",
    ),
    pytest.param(
        "jest", None, "jest_stderr.txt", "jest.json", 1, (2, 3, 2, 1), JEST_FAILING, id="jest-json"
    ),
    pytest.param(
        "jest", None, "jest_stderr.txt", None, 1, (2, 3, 2, 1), JEST_FAILING, id="jest-text"
    ),
    pytest.param(
        "vitest",
        "vitest_stdout.txt",
        "vitest_stderr.txt",
        "vitest.json",
        1,
        (2, 3, 2, 1),
        VITEST_FAILING,
        id="vitest-json",
    ),
    pytest.param(
        "vitest",
        "vitest_stdout.txt",
        "vitest_stderr.txt",
        None,
        1,
        (2, 3, 2, 1),
        [name.removeprefix("vt/") for name in VITEST_FAILING],
        id="vitest-coloured-text",
    ),
    pytest.param(
        "mocha", "mocha_stdout.txt", None, None, 3, (2, 3, 2, 0), MOCHA_FAILING, id="mocha-json"
    ),
    pytest.param(
        "mocha", "mocha_spec.txt", None, None, 3, (1, 3, 2, 0), MOCHA_FAILING, id="mocha-spec-text"
    ),
    pytest.param(
        "cargo",
        "cargo_stdout.txt",
        "cargo_stderr.txt",
        None,
        101,
        (4, 4, 1, 0),
        [
            "tests::nested::deep_fails",
            "tests::subtracts_badly",
            "integ_fails",
            "src/lib.rs - doc_bad (line 27)",
        ],
        id="cargo-libtest",
    ),
    pytest.param(
        "go", "go_json.txt", "go_stderr.txt", None, 1, (5, 2, 1, 1), GO_FAILING, id="go-json"
    ),
    pytest.param(
        "go", "go_text.txt", "go_stderr.txt", None, 1, (0, 2, 0, 1), GO_FAILING, id="go-text"
    ),
]


@pytest.mark.parametrize(
    ("runner", "stdout", "stderr", "report", "exit_code", "counts", "failing"), RECORDED
)
def test_parse_recorded_output(
    runner: str,
    stdout: str | None,
    stderr: str | None,
    report: str | None,
    exit_code: int,
    counts: tuple[int, int, int, int],
    failing: list[str],
) -> None:
    summary = parse(
        runner, fixture(stdout), fixture(stderr), fixture(report) if report else None, exit_code
    )

    assert summary.detected
    assert summary.runner == runner
    assert (summary.passed, summary.failed, summary.skipped, summary.errors) == counts
    assert summary.total == sum(counts)
    assert summary.failing_tests == failing
    assert not summary.failing_tests_truncated


@pytest.mark.parametrize(
    ("runner", "stdout", "stderr", "report", "exit_code", "counts", "failing"),
    [case for case in RECORDED if case.values[3] is None],
)
def test_parse_any_recognises_each_format(
    runner: str,
    stdout: str | None,
    stderr: str | None,
    report: None,
    exit_code: int,
    counts: tuple[int, int, int, int],
    failing: list[str],
) -> None:
    summary = parse_any(fixture(stdout), fixture(stderr), exit_code)

    assert summary.detected
    assert summary.runner == runner
    assert (summary.passed, summary.failed, summary.skipped, summary.errors) == counts
    assert summary.failing_tests == failing


@pytest.mark.parametrize(("report", "runner"), [("jest.json", "jest"), ("vitest.json", "vitest")])
def test_parse_any_finds_js_json_in_stdout(report: str, runner: str) -> None:
    summary = parse_any("> demo@1.0.0 test\n" + fixture(report) + "\n", "", 1)

    assert summary.runner == runner
    assert (summary.passed, summary.failed, summary.errors) == (2, 3, 1)


def test_parse_any_finds_junit_xml_in_stdout() -> None:
    stdout = "running the suite\n" + fixture("pytest_junit_xunit2.xml") + "\ndone\n"

    summary = parse_any(stdout, "", 1)

    assert summary.runner == "junit"
    assert (summary.passed, summary.failed, summary.skipped, summary.errors) == (6, 7, 4, 1)
    # Without the file attribute (junit_family=xunit2) names are classname.name.
    assert "tests.test_sample.TestThing.test_method_fails" in summary.failing_tests


def test_make_reports_the_runner_it_ran() -> None:
    summary = parse(
        "make", fixture("pytest_stdout.txt"), "make: *** [Makefile:2: test] Error 1", None, 2
    )

    assert summary.detected
    assert summary.runner == "pytest"
    assert summary.notes[0] == "make ran pytest (recognised by its output)"
    assert summary.failed == 7


def test_make_with_unknown_output_is_not_detected() -> None:
    summary = parse("make", "building...\nall good\n", "", None, 0)

    assert not summary.detected
    assert summary.notes[-1] == "could not read the test results; trust the exit code (0)"


def test_falling_back_to_a_text_summary_is_noted() -> None:
    from_report = parse("jest", "", fixture("jest_stderr.txt"), fixture("jest.json"), 1)
    from_text = parse("jest", "", fixture("jest_stderr.txt"), None, 1)

    assert from_report.notes == []
    assert from_text.notes == ["no machine-readable results; read jest's text summary instead"]


def test_cargo_compile_error_says_so() -> None:
    summary = parse("cargo", "", fixture("cargo_compile_error_stderr.txt"), None, 101)

    assert not summary.detected
    assert summary.runner == "cargo"
    assert summary.notes == [
        "cargo printed no test result: the crate did not compile",
        "could not read the test results; trust the exit code (101)",
    ]


def test_go_build_failure_is_an_error_named_by_package() -> None:
    summary = parse("go", fixture("go_json.txt"), fixture("go_stderr.txt"), None, 1)

    assert "example.com/demo/broken did not build" in summary.notes


def test_go_without_per_test_lines_says_counts_are_per_package() -> None:
    summary = parse("go", "ok  \texample.com/a\t0.01s\nok  \texample.com/b\t0.02s\n", "", None, 0)

    assert summary.detected
    assert summary.total == 0
    assert any("per-package results only (2 ok, 0 FAIL)" in note for note in summary.notes)


def test_plain_tap_from_another_producer() -> None:
    stdout = (
        "TAP version 13\n# add\nok 1 adds\nnot ok 2 subtracts\n  ---\n  ok 3 not a test\n  ...\n"
    )
    stdout += "ok 3 later # skip no db\n1..3\n# tests 3\n# pass  1\n# fail  1\n"

    summary = parse_any(stdout, "", 1)

    assert summary.runner == "tap"
    assert (summary.passed, summary.failed, summary.skipped) == (1, 1, 1)
    assert summary.failing_tests == ["subtracts"]


def test_unittest_before_python_3_11_names() -> None:
    stderr = (
        "test_a (pkg.tests.Case) ... FAIL\n\n"
        "======================================================================\n"
        "FAIL: test_a (pkg.tests.Case)\n"
        "----------------------------------------------------------------------\n"
        "AssertionError\n\n"
        "Ran 3 tests in 0.010s\n\nFAILED (failures=1, skipped=1)\n"
    )

    summary = parse("unittest", "", stderr, None, 1)

    assert (summary.passed, summary.failed, summary.skipped) == (1, 1, 1)
    assert summary.failing_tests == ["pkg.tests.Case.test_a"]


def test_pytest_colour_and_no_tests() -> None:
    stdout = (
        "\x1b[33m======= \x1b[33mno tests ran\x1b[0m\x1b[33m in 0.01s\x1b[0m\x1b[33m ==\x1b[0m\n"
    )

    summary = parse("pytest", stdout, "", None, 5)

    assert summary.detected
    assert summary.total == 0
    assert "no tests ran" in summary.notes


def test_exit_code_disagreeing_with_the_results_is_noted() -> None:
    passing = '<testsuites><testsuite><testcase classname="a" name="b"/></testsuite></testsuites>'

    crashed = parse("pytest", "", "", passing, 137)
    lying = parse("pytest", "", "", passing.replace("/>", "><failure/></testcase>"), 0)

    assert crashed.notes[-1].startswith("no test failed but the command exited 137")
    assert lying.notes[-1] == "tests failed but the command exited 0"


# --- hostile and broken input ------------------------------------------------------------------

BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol9 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
]>
<testsuites><testsuite><testcase name="&lol9;"><failure/></testcase></testsuite></testsuites>
"""
EXTERNAL_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE t [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<testsuites><testsuite><testcase name="&secret;"><failure/></testcase></testsuite></testsuites>
"""


@pytest.mark.parametrize("xml", [BILLION_LAUGHS, EXTERNAL_ENTITY], ids=["billion-laughs", "xxe"])
def test_xml_with_a_doctype_is_refused_unread(xml: str) -> None:
    summary = parse("pytest", "", "", xml, 1)

    assert not summary.detected
    assert summary.notes[0] == "the JUnit XML declares a DOCTYPE or ENTITY; refused it unread"
    assert parse_any(xml, "", 1).detected is False


def test_a_cut_report_falls_back_to_the_text_summary() -> None:
    junit = fixture("pytest_junit.xml")
    jest = fixture("jest.json")

    pytest_summary = parse("pytest", fixture("pytest_stdout.txt"), "", junit[: len(junit) // 2], 1)
    jest_summary = parse("jest", "", fixture("jest_stderr.txt"), jest[: len(jest) // 2], 1)
    alone = parse("vitest", "", "", fixture("vitest.json")[:300], 1)

    assert pytest_summary.detected
    assert pytest_summary.failed == 7
    assert pytest_summary.notes[0].startswith("the JUnit XML is not well-formed")
    assert jest_summary.detected
    assert jest_summary.failed == 3
    assert jest_summary.notes[0].startswith("the jest JSON report is not valid JSON")
    assert not alone.detected


def test_reports_of_the_wrong_shape() -> None:
    assert (
        parse("jest", "", "", "[1, 2, 3]", 1).notes[0] == "the jest JSON report has no testResults"
    )
    wrong_root = parse("pytest", "", "", "<html><testcase/></html>", 1)
    assert wrong_root.notes[0] == "the XML report's root is <html>, not <testsuites>"
    weird = {"testResults": [None, 3, {"assertionResults": [{"status": 5}, "x"], "name": 7}]}
    assert parse("jest", "", "", json.dumps(weird), 1).total == 0


@pytest.mark.parametrize("runner", [*test_readers.READERS, "make", "npm"])
def test_garbage_never_raises(runner: str) -> None:
    rng = random.Random(runner)
    noise = "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(20_000))
    lines = "\n".join(
        rng.choice(
            ["ok", "not ok 1 -", "{", '{"Action":"fail"', "test result:", "<testsuite", "Ran"]
        )
        + noise[i : i + 40]
        for i in range(0, 20_000, 40)
    )

    for text in (noise, lines, "\x00\xff" * 1000, "{" * 100_000, "[" * 100_000 + "]"):
        summary = parse(runner, text, text, text, 1)
        assert isinstance(summary, TestSummary)
    assert isinstance(parse_any(lines, noise, None), TestSummary)


def test_deep_nesting_does_not_break_readers() -> None:
    deep_xml = "<testsuites>" + "<a>" * 200_000 + "</a>" * 200_000 + "</testsuites>"
    deep_json = '{"stats": {}, "passes": ' + "[" * 200_000 + "]" * 200_000 + "}"

    assert parse("pytest", "", "", deep_xml, 0).total == 0
    assert not parse("mocha", deep_json, "", None, 1).detected
    assert not parse("jest", "", "", "[" * 200_000, 1).detected


def test_huge_inputs_are_cut_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(test_readers, "MAX_INPUT_CHARS", 1000)
    stdout = "x" * 5000 + "\n1 passed in 0.1s\n"
    report = fixture("pytest_junit.xml")

    summary = parse("pytest", stdout, "", report, 0)

    assert "stdout is over 0 MB; read its start only" in summary.notes
    assert "the report is over 0 MB; read its start only" in summary.notes
    assert not summary.detected  # the cut report is not XML, the summary line was cut away


def test_many_failures_are_capped_and_long_names_clipped() -> None:
    cases = "".join(
        f'<testcase classname="m" name="t{i}{"x" * (600 if i == 0 else 0)}"><failure/></testcase>'
        for i in range(300)
    )

    summary = parse("pytest", "", "", f"<testsuite>{cases}</testsuite>", 1)

    assert summary.failed == 300
    assert len(summary.failing_tests) == 200
    assert summary.failing_tests_truncated
    assert len(summary.failing_tests[0]) == 500
    assert summary.failing_tests[0].endswith("…")


def test_unknown_exit_127_hint() -> None:
    summary = parse("cargo", "", "sh: 1: cargo: not found\n", None, 127)

    assert not summary.detected
    assert summary.notes[-1].startswith("exit code 127: the command was not found")
