"""The deployment id: made once per state dir, then the same for every process that reads it."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

from app.root.state_dir import deployment_id
from app.settings import load_settings


def test_the_deployment_id_is_made_once_and_shared() -> None:
    settings = load_settings().storage
    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = set(pool.map(lambda _: deployment_id(settings), range(32)))
    assert len(ids) == 1  # processes starting together agree
    (made,) = ids
    assert re.fullmatch(r"[0-9a-f]{16}", made)
    assert deployment_id(settings) == made  # and a restart finds it again
    assert (settings.state_dir / "deployment-id").stat().st_mode & 0o077 == 0
