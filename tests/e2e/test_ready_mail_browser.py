"""The "your sandbox is ready" e-mail, end to end: the address typed into the real
sign-in page (headless Chromium), a queued call, the slot freed by the watchdog, and
the message received by a real SMTP server (aiosmtpd) in each security mode the server
offers: plain (loopback only), STARTTLS and implicit TLS, both with a login, the
certificate checked against a throwaway CA the server is told to trust."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import pytest
from browser_testkit import BUTTON, LoopbackSite, authorization, chromium, exchange, lands_on
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import probe
from oauth_browser import query_of
from playwright.sync_api import Browser, expect
from smtp_testkit import PASSWORD, USER, Security, smtp_server
from tls_testkit import make_ca

pytestmark = pytest.mark.e2e

WAITER = "waiter@example.test"
IDLE_S = 10  # the shortest idle timeout: the holder's slot is freed after it


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


def sign_in(browser: Browser, server: RunningServer, site: LoopbackSite, email: str | None) -> str:
    """Through the page, typing ``email`` if given; returns an access token."""
    auth = authorization(server, site.url("/callback"), client_name="Mail E2E Client")
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(auth.url)
        field = page.get_by_label("E-mail me once when my sandbox is ready (optional)")
        expect(field).to_be_visible()  # SMTP is configured: the page offers it
        if email is not None:
            field.fill(email)
        page.get_by_role("button", name=BUTTON).click()
        page.wait_for_url(lands_on(auth.redirect_uri))
        code = query_of(page.url)["code"]
    finally:
        context.close()
    response = exchange(server, auth, code)
    assert response.status_code == 200, response.text
    return str(response.json()["access_token"])


def take_slot(server: RunningServer, token: str) -> dict[str, Any]:
    """The probe tool, which takes a slot. In a thread of its own: Playwright's sync
    API keeps an event loop running in this one."""

    async def call() -> dict[str, Any]:
        async with httpx2.AsyncClient(timeout=60) as http:
            return await probe(http, server, token)

    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, call()).result()


# aiosmtpd warns that its login is not behind STARTTLS; in the tls mode it is behind TLS.
@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
@pytest.mark.parametrize("security", ["none", "starttls", "tls"])
def test_the_ready_mail_reaches_a_real_smtp_server(
    browser: Browser, tmp_path: Path, security: Security
) -> None:
    ca = make_ca(tmp_path / "ca", dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    login = (
        {}
        if security == "none"
        else {
            "SANDBOX_MCP_SMTP_USER": USER,
            "SANDBOX_MCP_SMTP_PASSWORD": PASSWORD,
        }
    )
    site = LoopbackSite()
    with smtp_server(security, ca) as (inbox, port):
        server = start_server(
            tmp_path / "state",
            probe=True,
            SANDBOX_MCP_AUTH="oauth",
            SANDBOX_MCP_POOL_SIZE="1",
            SANDBOX_MCP_IDLE_TIMEOUT_S=str(IDLE_S),
            SANDBOX_MCP_QUEUE_WAIT_S="0",
            SANDBOX_MCP_SMTP_HOST="127.0.0.1",
            SANDBOX_MCP_SMTP_PORT=str(port),
            SANDBOX_MCP_SMTP_SECURITY=security,
            SANDBOX_MCP_SMTP_SENDER="sandbox@example.test",
            # The server's TLS client trusts this CA only (OpenSSL reads SSL_CERT_FILE).
            SSL_CERT_FILE=str(ca.ca_pem),
            **login,
        )
        try:
            holder = sign_in(browser, server, site, email=None)
            waiter = sign_in(browser, server, site, email=WAITER)
            assert not take_slot(server, holder)["is_error"]
            queued = take_slot(server, waiter)
            assert queued["error"]["code"] == "SANDBOX_QUEUED", queued
            # The holder goes quiet; the waiter keeps its place as a waiting client does
            # (a silent place lapses after the idle timeout too); the watchdog frees the
            # holder's slot, reserves it for the waiter and the message leaves. Driven
            # by its arrival, within a minute.
            deadline = time.monotonic() + 60 + IDLE_S
            while not inbox.wait_for(1, timeout_s=2) and time.monotonic() < deadline:
                take_slot(server, waiter)
            arrived = inbox.wait_for(1, timeout_s=0)
            assert len(arrived) == 1, server.log()[-3000:]
            [received] = arrived
        finally:
            stop_server(server)
            site.close()
    assert received.recipients == [WAITER]
    assert received.message["Subject"] == "Your sandbox is ready"
    assert received.message["To"] == WAITER
    assert server.base_url in received.message.get_payload()
    assert received.over_tls is (security != "none")
    assert received.login == (None if security == "none" else USER)
    assert inbox.wait_for(2, timeout_s=0) == [received], "one message, to the one address"
    log = server.log()
    assert '"mail.sent"' in log
    assert WAITER not in log
    assert PASSWORD not in log
