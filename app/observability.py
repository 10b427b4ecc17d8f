"""Structured logging: JSON lines on stderr, scrubbed of secrets before they are written.

Redaction lives in the processor chain, not at call sites, so a call site that
forgets cannot leak. stdout is never written to: the stdio transport owns it.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

REDACTED = "[redacted]"

# Keys whose values are credentials whatever they hold. Matched anywhere in the
# key, case-insensitively, after dropping separators: "X-Api-Key", "api_key",
# "refreshToken" and "db_password" all match. Not "code": it is every error's stable
# code (hidden, the log could not say what failed); an OAuth code's value carries
# its prefix, which _TOKEN_PREFIXES scrubs under any key.
_SECRET_KEY = re.compile(
    r"token|secret|passw|pwd|authorization|apikey|cookie|credential|privatekey|verifier|"
    r"sessionid|email|^key$|sandboxkey"
)
# Values that carry a credential whatever key they sit under.
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@")
_TOKEN_PREFIXES = re.compile(r"\b(smcp_(?:at|rt|code)_)[A-Za-z0-9_-]+")
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")


def _is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(re.sub(r"[^a-z]", "", key.lower())))


def _scrub_text(text: str) -> str:
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    text = _TOKEN_PREFIXES.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    return _EMAIL.sub(REDACTED, text)


def scrub(value: Any, depth: int = 0) -> Any:
    """Return ``value`` with secret-shaped keys and strings redacted (recursively)."""
    if depth > 8:
        return REDACTED
    if isinstance(value, str):
        return _scrub_text(value)
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if isinstance(k, str) and _is_secret_key(k) else scrub(v, depth + 1))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [scrub(v, depth + 1) for v in value]
    return value


def redact_secrets(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """structlog processor: scrub every field of the event, the event name included."""
    return {
        key: (
            REDACTED
            if key not in ("event", "level", "timestamp", "logger") and _is_secret_key(key)
            else scrub(value)
        )
        for key, value in event_dict.items()
    }


def configure_logging(
    level: str = "INFO", stream: TextIO | None = None, *, count_events: Processor | None = None
) -> None:
    """Route structlog and the standard library's loggers to one JSON stream.

    Called once by the composition root. Standard-library loggers (uvicorn, the
    MCP SDK) go through the same redaction as ours. ``count_events`` sees each of
    our events before the level filter, so metrics count DEBUG events too.
    """
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        redact_secrets,
    ]
    structlog.configure(
        processors=[
            *([count_events] if count_events is not None else []),
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.ExtraAdder(), *shared],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.JSONRenderer(default=str),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # uvicorn installs its own handlers when it configures logging; we pass it
    # log_config=None and let its records propagate here instead.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    access = logging.getLogger("uvicorn.access")
    access.filters[:] = [f for f in access.filters if not isinstance(f, _AnsweredMcpRequests)]
    access.addFilter(_AnsweredMcpRequests())
    # Alembic narrates every start-up at INFO ("setup plugin ..."); its errors still show.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))


class _AnsweredMcpRequests(logging.Filter):
    """Drops uvicorn's access line of each answered ``/mcp`` request: its call is told by
    the tool runner's ``tool.call`` line, which is bounded per sandbox (a refused call
    repeated a hundred times a second wrote one access line each, unbounded; issue 23).
    Refused requests (401, 4xx) keep theirs: no sandbox is known to bound them by."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn's access record: (client, method, path, http version, status)
        if isinstance(args, tuple) and len(args) == 5:
            path, status = args[2], args[4]
            if isinstance(path, str) and path.split("?")[0] == "/mcp":
                return not (isinstance(status, int) and 200 <= status < 300)
        return True
