"""The sign-in page in a real browser: Debian's headless Chromium, driven by Playwright.

The OAuth checklist (test_oauth_checklist.py) plays the browser with plain HTTP; here a
real one loads the page, presses the button, follows the 303 to the client's redirect URI
(a loopback server this test runs) and refuses to show the page inside another site's
frame. The browser is /usr/bin/chromium (`apt-get install -y chromium`, which
.ci/lib/install-packages.sh does); Playwright's own browser download is never used.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Iterator
from html import escape
from pathlib import Path

import pytest
from browser_testkit import (
    BUTTON,
    CLIENT_NAME,
    Authorization,
    LoopbackSite,
    authorization,
    chromium,
    exchange,
    lands_on,
)
from e2e_server import RunningServer, Servers
from oauth_browser import query_of
from playwright.sync_api import (
    APIResponse,
    Browser,
    Page,
    Request,
    Response,
    Route,
    expect,
)
from playwright.sync_api import Error as PlaywrightError

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO_ROOT / "artifacts" / "screenshots" / "signin.png"
# The README's picture: this test makes it afresh as README_SHOT; docs/signin.png is
# that file, copied (cp artifacts/screenshots/readme-signin.png docs/signin.png).
README_PICTURE = REPO_ROOT / "docs" / "signin.png"
README_SHOT = SCREENSHOT.with_name("readme-signin.png")
CREATED = "oauth.sandbox_created"  # the server's log event for a new sandbox


@pytest.fixture
def site() -> Iterator[LoopbackSite]:
    running = LoopbackSite()
    yield running
    running.close()


# -- the server, the browser, the client ----------------------------------------------

IDLE_S = 900  # not the default 600: the page must state the setting, not a constant


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> RunningServer:
    return serve_module(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="4",
        SANDBOX_MCP_REGISTRATIONS_PER_MINUTE="1000",
        SANDBOX_MCP_SIGNINS_PER_MINUTE="1000",
        SANDBOX_MCP_IDLE_TIMEOUT_S=str(IDLE_S),
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()  # its own cookie jar
    yield context.new_page()
    context.close()


def assert_real_code(server: RunningServer, auth: Authorization, code: str) -> None:
    response = exchange(server, auth, code)
    assert response.status_code == 200, response.text
    tokens = response.json()
    assert tokens["token_type"] == "Bearer"
    assert tokens["access_token"].startswith("smcp_at_")
    assert tokens["refresh_token"].startswith("smcp_rt_")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    assert len(data) > 5_000, f"{path} is only {len(data)} bytes: a blank page?"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def assert_png(path: Path) -> None:
    width, height = png_size(path)
    assert width >= 800, (width, height)
    assert height >= 400, (width, height)


def wait_until(page: Page, condition: Callable[[], bool], timeout_ms: int = 5_000) -> None:
    """Polls `condition` while letting Playwright deliver its events."""
    for _ in range(timeout_ms // 20):
        if condition():
            return
        page.wait_for_timeout(20)
    assert condition(), "timed out"


def test_the_readme_picture_is_the_sign_in_page_as_claude_code_sees_it(
    server: RunningServer, browser: Browser, site: LoopbackSite
) -> None:
    """The picture the README opens with: the page Claude Code's `claude mcp login`
    opens, its button and the name the client gave. A change of the page's layout
    changes its size, and then docs/signin.png is stale: copy README_SHOT over it."""
    auth = authorization(server, site.url("/callback"), client_name="Claude Code")
    context = browser.new_context(viewport={"width": 760, "height": 480})
    try:
        page = context.new_page()
        page.goto(auth.url)
        expect(page.get_by_role("button", name=BUTTON)).to_be_visible()
        expect(page.locator("p.who")).to_contain_text("Claude Code")
        README_SHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=README_SHOT, full_page=True)
    finally:
        context.close()
    assert png_size(README_PICTURE) == png_size(README_SHOT)


# -- (a) the sign-in -------------------------------------------------------------------


def test_the_button_signs_in_and_lands_on_the_callback_with_a_real_code(
    server: RunningServer, page: Page, site: LoopbackSite
) -> None:
    auth = authorization(server, site.url("/callback"))

    answer = page.goto(auth.url)
    assert answer is not None
    assert answer.status == 200
    button = page.get_by_role("button", name=BUTTON)
    expect(button).to_be_visible()
    expect(page.get_by_role("heading", name="Sandbox sign-in")).to_be_visible()
    who = page.locator("p.who")
    expect(who).to_contain_text(CLIENT_NAME)
    expect(who).to_contain_text("127.0.0.1")  # where the user will be sent back to
    # The server by its host, the idle rule from the setting, "sent back" said once.
    server_host = server.base_url.split("//", 1)[1]
    expect(who.first).to_contain_text(f"a private sandbox on {server_host}")
    expect(page.get_by_text("A sandbox left idle for 15 minutes is emptied")).to_be_visible()
    body = page.locator("body").inner_text()
    assert body.count("sent back") == 1, body

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOT, full_page=True)
    assert_png(SCREENSHOT)

    button.click()
    page.wait_for_url(lands_on(auth.redirect_uri))
    expect(page.get_by_text("signed in")).to_be_visible()

    [query] = site.callbacks()
    assert query == query_of(page.url)
    assert set(query) == {"code", "state", "iss"}
    assert query["state"] == auth.state
    assert query["iss"] == server.base_url
    assert_real_code(server, auth, query["code"])


# -- (b) no framing ----------------------------------------------------------------------


def test_another_origin_cannot_frame_the_page_but_it_loads_at_top_level(
    server: RunningServer, page: Page, site: LoopbackSite
) -> None:
    auth = authorization(server, site.url("/callback"))
    framer = LoopbackSite()  # a second port: another origin than the server and the client
    try:
        framer.pages["/frame"] = (
            "<!doctype html><title>framer</title><h1>Not the sandbox server</h1>"
            f'<iframe id="signin" src="{escape(auth.url)}" width="600" height="500"></iframe>'
        )
        console: list[str] = []
        page.on("console", lambda message: console.append(message.text))
        served: list[Response] = []

        def record(response: Response) -> None:
            if response.url.startswith(f"{server.base_url}/authorize?"):
                served.append(response)

        page.on("response", record)

        page.goto(framer.url("/frame"))
        page.wait_for_load_state("load")
    finally:
        framer.close()

    # The server did answer the framed request, with the headers that forbid framing ...
    [framed] = served
    assert framed.status == 200
    assert framed.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in framed.headers["content-security-policy"]
    # ... and Chromium put its error page in the frame instead of the sign-in page.
    [frame] = [frame for frame in page.frames if frame is not page.main_frame]
    assert frame.url.startswith("chrome-error://"), frame.url
    assert frame.get_by_role("button").count() == 0
    assert BUTTON not in frame.content()
    wait_until(page, lambda: any("frame-ancestors" in text for text in console))

    # The same URL, at top level, is the sign-in page.
    answer = page.goto(auth.url)
    assert answer is not None
    assert answer.status == 200
    expect(page.get_by_role("button", name=BUTTON)).to_be_visible()
    assert site.callbacks() == []


# -- (c) double submits ------------------------------------------------------------------


def test_a_double_click_lands_once_with_one_sandbox(
    server: RunningServer, page: Page, site: LoopbackSite
) -> None:
    auth = authorization(server, site.url("/callback"))
    created_before = server.log().count(CREATED)
    page.goto(auth.url)
    posts: list[Request] = []
    page.on("request", lambda request: posts.append(request) if request.method == "POST" else None)

    page.get_by_role("button", name=BUTTON).dblclick()
    page.wait_for_url(lands_on(auth.redirect_uri))
    page.wait_for_load_state("load")

    assert 1 <= len(posts) <= 2
    codes = {query["code"] for query in site.callbacks()}
    assert len(codes) == 1, site.requests
    assert query_of(page.url)["code"] in codes
    assert server.log().count(CREATED) - created_before == 1
    assert_real_code(server, auth, codes.pop())


def test_two_submits_that_both_reach_the_server_get_the_same_code_and_one_sandbox(
    server: RunningServer, page: Page, site: LoopbackSite
) -> None:
    """Chromium sends one POST for a fast double click; here the first POST hangs
    (as on a slow network) so the second click really submits again. The test sends each
    POST on to the server itself and holds its answer until both went out."""
    auth = authorization(server, site.url("/callback"))
    created_before = server.log().count(CREATED)
    page.goto(auth.url)

    held: list[tuple[Route, APIResponse]] = []

    def hold(route: Route) -> None:
        if route.request.method != "POST":
            route.continue_()
            return
        held.append((route, route.fetch(max_redirects=0)))

    page.route(lambda url: url == f"{server.base_url}/authorize", hold)
    box = page.get_by_role("button", name=BUTTON).bounding_box()
    assert box is not None
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    # page.mouse does not wait for the navigation the click starts, which never ends here.
    page.mouse.click(x, y)
    wait_until(page, lambda: len(held) == 1)
    page.mouse.click(x, y)
    wait_until(page, lambda: len(held) == 2)

    answers = [answer for _route, answer in held]
    assert [answer.status for answer in answers] == [303, 303]
    locations = {answer.headers["location"] for answer in answers}
    assert len(locations) == 1, locations
    for route, answer in reversed(held):
        # The browser dropped the first navigation when the second began.
        with contextlib.suppress(PlaywrightError):
            route.fulfill(response=answer)
    page.wait_for_url(lands_on(auth.redirect_uri))

    [location] = locations
    [query] = site.callbacks()
    assert query == query_of(location)
    assert query["state"] == auth.state
    assert server.log().count(CREATED) - created_before == 1
    assert_real_code(server, auth, query["code"])


# -- (d) the e-mail field -----------------------------------------------------------------


def test_without_smtp_the_page_asks_for_no_e_mail(
    server: RunningServer, page: Page, site: LoopbackSite
) -> None:
    # This server has no SANDBOX_MCP_SMTP_HOST: nothing could send the message.
    page.goto(authorization(server, site.url("/callback")).url)
    expect(page.get_by_role("button", name=BUTTON)).to_be_visible()
    expect(page.locator("input[type=email]")).to_have_count(0)
    assert "E-mail me" not in page.content()
