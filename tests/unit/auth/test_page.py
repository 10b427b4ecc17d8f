"""The sign-in page's words: who asks, on which server, what happens to an idle
sandbox (from the setting), and where the browser goes next, said once (issue 27:
"You will be sent back" twice, no server host, no idle rule)."""

from __future__ import annotations

import re
from html import unescape

import pytest

from auth.page import signin_page


def text_of(redirect_uri: str, idle_s: int = 600) -> str:
    page = signin_page(
        client_name="Claude",
        client_id="abc",
        redirect_uri=redirect_uri,
        tx="t",
        csrf="c",
        ask_email=False,
        server="sandbox.example.org",
        idle_s=idle_s,
    )
    return unescape(re.sub(r"<[^>]+>", "", page))


@pytest.mark.parametrize(
    "redirect_uri", ["http://127.0.0.1:33418/callback", "https://claude.ai/api/callback"]
)
def test_the_page_names_the_server_and_says_once_where_it_sends_you(redirect_uri: str) -> None:
    text = text_of(redirect_uri)
    assert "Claude wants a private sandbox on sandbox.example.org to run code in." in text
    assert text.count("sent back") == 1, text
    host = redirect_uri.split("/")[2].split(":")[0]
    assert f"You will be sent back to {host}" in text


def test_a_loopback_callback_is_called_a_program_on_this_computer() -> None:
    assert "a program on this computer" in text_of("http://127.0.0.1:1/cb")
    assert "this computer" not in text_of("https://claude.ai/api/callback")


@pytest.mark.parametrize(
    ("idle_s", "words"),
    [
        (600, "10 minutes"),
        (60, "1 minute"),
        (3600, "1 hour"),
        (7200, "2 hours"),
        (90, "90 seconds"),
    ],
)
def test_the_idle_rule_comes_from_the_setting(idle_s: int, words: str) -> None:
    text = text_of("https://claude.ai/api/callback", idle_s)
    assert f"A sandbox left idle for {words} is emptied" in text
    assert text.count("idle") == 1
