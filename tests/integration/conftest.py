"""Fixtures shared by the integration tests of several packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from db_testkit import fresh_postgres_blocking
from smtp_testkit import Inbox, smtp_server


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    """A real SMTP server on loopback (no TLS): its inbox and port."""
    with smtp_server("none") as running:
        yield running


@pytest.fixture
def database_url() -> Iterator[str]:
    """The URL of a new, empty database on the real PostgreSQL, dropped afterwards."""
    with fresh_postgres_blocking() as url:
        yield url
