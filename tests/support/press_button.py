"""A person in a browser, for Claude Code's $BROWSER: open the sign-in page, press
"Create my sandbox", follow the redirect to the client's loopback callback.

    python press_button.py AUTHORIZE_URL   (appends one JSON line to $PRESS_BUTTON_LOG)
"""

from __future__ import annotations

import json
import os
import re
import sys
from urllib.parse import urljoin

import httpx2


def press(authorize_url: str) -> dict[str, object]:
    with httpx2.Client(timeout=30) as browser:
        page = browser.get(authorize_url)
        tx = re.search(r'name="tx" value="([^"]+)"', page.text)
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        seen: dict[str, object] = {
            "url": authorize_url,
            "page": page.status_code,
            "button": "Create my sandbox" in page.text,
        }
        if page.status_code != 200 or not tx or not csrf:
            return {**seen, "error": page.text[:2000]}
        pressed = browser.post(
            urljoin(authorize_url, "/authorize"),
            data={"tx": tx.group(1), "csrf": csrf.group(1)},
            headers={"cookie": "; ".join(f"{k}={v}" for k, v in page.cookies.items())},
        )
        location = pressed.headers.get("location", "")
        seen |= {"pressed": pressed.status_code, "location": location}
        if pressed.status_code != 303:
            return {**seen, "error": pressed.text[:2000]}
        landed = browser.get(location)  # the client's own callback server
        return {**seen, "landed": landed.status_code}


if __name__ == "__main__":
    result = press(sys.argv[1])
    with open(os.environ["PRESS_BUTTON_LOG"], "a") as log:
        log.write(json.dumps(result) + "\n")
