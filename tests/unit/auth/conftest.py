"""Fixtures for the client-document tests: a throwaway CA and a TLS document server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tls_testkit import DocumentServer, ThrowawayCA, make_ca


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> ThrowawayCA:
    """Certifies client.test and 127.0.0.1 (both served on loopback)."""
    return make_ca(
        Path(tmp_path_factory.mktemp("ca")), dns_names=["client.test"], ip_addresses=["127.0.0.1"]
    )


@pytest.fixture
async def server(ca: ThrowawayCA) -> AsyncIterator[DocumentServer]:
    async with DocumentServer(ca.server_context()) as running:
        yield running
