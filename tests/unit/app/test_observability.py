from __future__ import annotations

import io
import json
import logging

import pytest
import structlog

from app.observability import configure_logging, scrub

SECRETS = {
    "access_token": "tok-aaaaaaaaaaaa",
    "refresh_token": "tok-bbbbbbbbbbbb",
    "client_secret": "sec-cccccccccccc",
    "password": "pw-dddddddddddd",
    "db_password": "pw-eeeeeeeeeeee",
    "Authorization": "Bearer hdr-ffffffffffff",
    "X-Api-Key": "key-gggggggggggg",
    "apiKey": "key-hhhhhhhhhhhh",
    "cookie": "session=cookie-iiiiiiiiiiii",
    "set_cookie": "cookie-jjjjjjjjjjjj",
    "code_verifier": "ver-kkkkkkkkkkkk",
    "email": "person@example.org",
    "sandbox_key": "sbkey-llllllllllll",
}
SECRET_VALUES = [v.split()[-1].split("=")[-1] for v in SECRETS.values()]


def capture() -> io.StringIO:
    stream = io.StringIO()
    configure_logging("DEBUG", stream=stream)
    return stream


def test_secret_shaped_keys_are_scrubbed_at_any_depth() -> None:
    stream = capture()
    structlog.get_logger("t").info(
        "leaky.event",
        **SECRETS,
        nested={"inner": dict(SECRETS), "list": [dict(SECRETS)]},
        safe="visible-value",
    )
    output = stream.getvalue()
    for value in SECRET_VALUES:
        assert value not in output, value
    record = json.loads(output)
    assert record["safe"] == "visible-value"
    assert record["event"] == "leaky.event"
    assert record["nested"]["inner"]["password"] == "[redacted]"


def test_bearer_strings_and_url_passwords_are_scrubbed_in_free_text() -> None:
    stream = capture()
    structlog.get_logger("t").warning(
        "free.text",
        detail="sent Authorization: Bearer abc.DEF-123_xyz to postgresql://u:hunter2@db/x",
        note="token smcp_at_Zm9vYmFy seen; mail me at a.b@example.com",
    )
    output = stream.getvalue()
    for leaked in ("abc.DEF-123_xyz", "hunter2", "Zm9vYmFy", "a.b@example.com"):
        assert leaked not in output
    assert "Bearer [redacted]" in output


def test_standard_library_loggers_are_scrubbed_too() -> None:
    stream = capture()
    logging.getLogger("uvicorn.error").error("header was Bearer stdlib-secret-value")
    output = stream.getvalue()
    assert "stdlib-secret-value" not in output
    assert json.loads(output)["logger"] == "uvicorn.error"


def test_scrub_leaves_ordinary_data_alone() -> None:
    data = {"tool": "run_tests", "exit_code": 1, "paths": ["a.py", "b.py"], "ms": 1.5}
    assert scrub(data) == data


def test_nothing_is_written_to_stdout(capsys: object) -> None:
    configure_logging("DEBUG")
    structlog.get_logger("t").info("to.stderr", value=1)
    captured = capsys.readouterr()  # type: ignore[attr-defined]
    assert captured.out == ""
    assert "to.stderr" in captured.err


def test_error_codes_are_written_but_an_oauth_code_s_value_is_not() -> None:
    """A field named ``code`` is an error's stable code, written as it is (it read
    "[redacted]", issue 27); an authorization code's value is scrubbed by its prefix,
    whatever key it sits under."""
    stream = capture()
    structlog.get_logger("t").warning(
        "experiments.sweep_skipped", code="RUNTIME_UNAVAILABLE", detail={"code": "NOT_FOUND"}
    )
    structlog.get_logger("t").info("oauth.leak", code="smcp_code_c2VjcmV0Y29kZQ")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["code"] == "RUNTIME_UNAVAILABLE"
    assert first["detail"] == {"code": "NOT_FOUND"}
    assert second["code"] == "smcp_code_[redacted]"


def test_a_test_that_configures_no_logging_prints_no_log_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Between tests logging is the suite's (tests/conftest.py), never structlog's
    defaults, which print console lines on stdout: a background thread's late
    ``[info] slot.trash_deleted`` landed in the test output (issue 27)."""
    structlog.get_logger("pool.slots_dir").info("slot.trash_deleted", path="x", ms=1.0)
    structlog.get_logger("t").warning("some.warning")
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "")
