"""The MCP Apps view rendered for real: Debian's headless Chromium (Playwright) loads a
host page built on the ext-apps SDK's host bridge (tests/support/apps_host.py), which
talks to the real server over HTTP with a signed-in token, reads the ``ui://``
resource and mounts it in a sandboxed iframe under the CSP the resource declares.

The test makes an experiment, runs a failing command and a failing test, calls
``get_experiment`` through the host, and reads from the view's DOM the experiment's id
and state, the command's exit code and the failing test's name. The same page checks
the view's ``ui/notifications/initialized`` and that the CSP blocks a request to
another origin. A screenshot is kept: artifacts/screenshots/view.png (docs/view.png is
that file, copied: cp artifacts/screenshots/view.png docs/view.png).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2
import pytest
from apps_host import AppsHost
from browser_testkit import chromium
from e2e_server import RunningServer, Servers
from mcp_http import tool
from oauth_browser import new_user
from playwright.sync_api import Frame, Page, expect

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO_ROOT / "artifacts" / "screenshots" / "view.png"
FAILING_TESTS = (
    "import unittest\n\n"
    "class Checks(unittest.TestCase):\n"
    "    def test_fine(self):\n        self.assertTrue(True)\n\n"
    "    def test_broken_widget(self):\n        self.assertEqual(1, 2)\n"
)
TIMEOUT_MS = 60_000  # a bound on a loaded machine, never a measure of speed


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> RunningServer:
    return serve_module(SANDBOX_MCP_AUTH="oauth", SANDBOX_MCP_SIGNINS_PER_MINUTE="100")


def prepare(server: RunningServer) -> tuple[str, str, str]:
    """A signed-in user with an experiment that ran a failing command and a failing test:
    (token, experiment id, its state as get_experiment tells it)."""

    async def work() -> tuple[str, str, str]:
        async with httpx2.AsyncClient(timeout=120) as http:
            token = await new_user(http, server.base_url)
            created = await tool(
                http,
                server,
                token,
                "create_experiment",
                {"name": "widget fix", "files": {"test_checks.py": FAILING_TESTS}},
            )
            exp = created["experiment_id"]
            ran = await tool(
                http,
                server,
                token,
                "execute_experiment",
                {
                    "experiment_id": exp,
                    "command": (
                        "printf 'def widget():\\n    return 2\\n' > widget.py; "
                        "echo nope >&2; exit 3"
                    ),
                },
            )
            assert ran["exit_code"] == 3, ran
            tests = await tool(
                http,
                server,
                token,
                "run_tests",
                {"experiment_id": exp, "command": "python3 -m unittest -v"},
            )
            assert tests["tests"]["failed"] == 1, tests
            # A second approach, for the side-by-side comparison.
            await tool(http, server, token, "create_experiment", {"name": "widget rewrite"})
            got = await tool(http, server, token, "get_experiment", {"experiment_id": exp})
            return token, exp, got["state"]

    return asyncio.run(work())


def view_frame(page: Page) -> Frame:
    handle = page.wait_for_selector("iframe#view", timeout=TIMEOUT_MS)
    frame = handle.content_frame()
    assert frame is not None
    return frame


def test_the_view_shows_the_sandbox_in_a_real_host(server: RunningServer) -> None:
    token, exp, state_now = prepare(server)
    host = AppsHost(server.mcp_url, token)
    try:
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 920, "height": 1220})
            console: list[str] = []
            page.on("console", lambda message: console.append(message.text))
            page.goto(host.url("/"))
            page.wait_for_function("window.hostReady === true", timeout=TIMEOUT_MS)
            mounted = page.evaluate(
                "([name, args]) => window.host.mount(name, args)",
                ["get_experiment", {"experiment_id": exp}],
            )
            assert mounted["uri"] == "ui://sandbox-mcp/view.html"
            assert mounted["domain"].endswith(".claudemcpcontent.com")

            frame = view_frame(page)
            row = frame.locator(f'tr[data-experiment-id="{exp}"]')
            expect(row.locator(".exp-id")).to_have_text(exp, timeout=TIMEOUT_MS)
            expect(row.locator(".exp-state")).to_have_text(state_now)
            expect(frame.locator("#detail-state")).to_have_text(state_now)
            jobs = frame.locator("#jobs")
            expect(jobs.locator(".job-exit", has_text="exit 3")).to_have_count(
                1, timeout=TIMEOUT_MS
            )
            expect(jobs.locator(".failing-test")).to_contain_text("test_broken_widget")
            expect(jobs.locator(".job-tail").first).to_be_visible()
            expect(frame.locator("#detail-id")).to_have_text(exp)
            expect(frame.locator("#idle")).to_contain_text("without activity")

            # The view said it was ready, once, before its first call through the host.
            state = page.evaluate("window.host.state")
            assert state["initialized"] == 1, state
            assert state["initializedBeforeCalls"] is True, state
            assert "view_sandbox" in state["viewCalls"], state

            # Two experiments ticked and compared side by side (compare_experiments).
            boxes = frame.locator("#experiments input[type=checkbox]")
            expect(boxes).to_have_count(2)
            boxes.nth(0).check()
            boxes.nth(1).check()
            frame.locator("#compare-button").click()
            expect(frame.locator("#compare .col")).to_have_count(2, timeout=TIMEOUT_MS)
            expect(frame.locator(f'#compare .col[data-experiment-id="{exp}"]')).to_contain_text(
                "1 passed, 1 failed"
            )

            # A file's diff on click: the change report, then the file.
            frame.locator("#changes-button").click()
            frame.locator("#changes .file", has_text="widget.py").click(timeout=TIMEOUT_MS)
            expect(frame.locator("#diff pre.diff")).to_contain_text(
                "+    return 2", timeout=TIMEOUT_MS
            )

            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.locator("iframe#view").screenshot(path=str(SCREENSHOT))
            assert SCREENSHOT.stat().st_size > 10_000

            # The declared CSP holds: a request to another origin (this very host, a
            # different origin from the sandboxed view's opaque one) never leaves.
            outcome = frame.evaluate(
                """(url) => fetch(url).then(() => "loaded", (e) => "blocked: " + e)""",
                host.url("/beacon-fetch"),
            )
            assert outcome.startswith("blocked"), outcome
            frame.evaluate(
                "(url) => { const i = new Image(); i.src = url; document.body.append(i); }",
                host.url("/beacon-image"),
            )
            page.wait_for_timeout(500)  # the image, if allowed, would have been asked for
            assert not [path for path in host.requests if path.startswith("/beacon")]
            assert any("Content Security Policy" in line for line in console), console
            page.close()
    finally:
        host.close()
    # The view reached the server only through the host, as the view tools.
    assert not [
        line
        for line in host.requests
        if line not in ("/", "/host-bridge.js", "/mcp", "/favicon.ico")
    ]
