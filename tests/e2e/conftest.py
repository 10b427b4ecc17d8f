from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_server import RunningServer, start_server, stop_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    running = start_server(tmp_path / "state")
    yield running
    stop_server(running)
