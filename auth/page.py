"""The sign-in page and the local error page: plain HTML, no script, nothing framed."""

from __future__ import annotations

from html import escape
from urllib.parse import urlsplit

from starlette.responses import HTMLResponse

from auth.redirects import is_loopback

_STYLE = """
body{font-family:system-ui,sans-serif;max-width:28rem;margin:12vh auto;padding:0 1rem;color:#1d1d1f}
h1{font-size:1.4rem}p{line-height:1.5}.who{color:#555;font-size:.95rem}
button{font-size:1.1rem;padding:.8rem 1.6rem;border:0;border-radius:.5rem;
  background:#1f6feb;color:#fff;cursor:pointer}
label{display:block;margin:1.2rem 0 .3rem;font-size:.9rem;color:#333}
input[type=email]{width:100%;padding:.5rem;font-size:1rem;box-sizing:border-box}
small{color:#666}.warn{background:#fff8c5;padding:.6rem;border-radius:.4rem}
"""


def security_headers(form_target: str | None = None, *, secure: bool = False) -> dict[str, str]:
    """Clickjacking and leak protection for the page, its POST and its errors (BCP 4.16)."""
    form_action = "'self'"
    if form_target:
        parts = urlsplit(form_target)
        # Browsers apply form-action to the redirect after the POST too.
        form_action += f" {parts.scheme}://{parts.netloc}"
    headers = {
        "Content-Security-Policy": (
            f"default-src 'none'; style-src 'unsafe-inline'; form-action {form_action}; "
            "frame-ancestors 'none'; base-uri 'none'"
        ),
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
    }
    if secure:
        headers["Strict-Transport-Security"] = "max-age=31536000"
    return headers


def signin_page(
    *,
    client_name: str | None,
    client_id: str,
    redirect_uri: str,
    tx: str,
    csrf: str,
    ask_email: bool,
    server: str,
    idle_s: int,
) -> str:
    """The page ``/authorize`` shows: who asks, on which server (``server``, the public
    URL's host), what an idle sandbox becomes after ``idle_s``, where the browser goes
    next (said once), and the one button."""
    name = escape(client_name or "An application")
    redirect_host = urlsplit(redirect_uri).hostname or ""
    host = escape(redirect_host)
    # A metadata-document client names itself by URL: show whose site vouches for the name.
    source = (
        f'<p class="who">Its name comes from <strong>{escape(urlsplit(client_id).hostname or "")}'
        "</strong>.</p>"
        if client_id.startswith("https://")
        else ""
    )
    back = (
        f'<p class="warn">You will be sent back to <strong>{host}</strong>, a program on '
        "<strong>this computer</strong>. Continue only if you started this sign-in from "
        "such a program yourself.</p>"
        if is_loopback(redirect_host)
        else f'<p class="who">You will be sent back to <strong>{host}</strong>.</p>'
    )
    email = (
        '<label for="email">E-mail me once when my sandbox is ready (optional)</label>'
        '<input type="email" id="email" name="email" maxlength="254" autocomplete="email">'
        "<small>Used for that single message only, then deleted. Never stored on disk.</small>"
        if ask_email
        else ""
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>Create my sandbox</title><style>{_STYLE}</style></head><body>"
        "<h1>Sandbox sign-in</h1>"
        f'<p class="who"><strong>{name}</strong> wants a private sandbox on '
        f"<strong>{escape(server)}</strong> to run code in.</p>"
        f"{source}{back}"
        "<p>No account and no password: pressing the button creates an anonymous sandbox "
        f"that belongs to this sign-in. A sandbox left idle for {_duration(idle_s)} is "
        "emptied (its files and experiments deleted); the sign-in stays valid and gets a "
        "new, empty one.</p>"
        '<form method="post" action="/authorize">'
        f'<input type="hidden" name="tx" value="{escape(tx)}">'
        f'<input type="hidden" name="csrf" value="{escape(csrf)}">'
        f"{email}"
        '<p><button type="submit">Create my sandbox</button></p>'
        "</form></body></html>"
    )


def _duration(seconds: int) -> str:
    """``600`` -> "10 minutes": the idle rule as a person reads it."""
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


def error_page(title: str, message: str, status: int, *, secure: bool) -> HTMLResponse:
    body = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1><p>{escape(message)}</p></body></html>"
    )
    return HTMLResponse(body, status_code=status, headers=security_headers(secure=secure))
