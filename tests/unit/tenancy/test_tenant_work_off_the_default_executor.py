"""The loop's default executor is the server's upkeep's: no tenant-facing module hands
it work (``asyncio.to_thread``), or one tenant's flood of calls could fill it again
(tests/e2e/test_thread_flood_over_http.py). Their blocking work goes through the
call's ``in_thread`` (app/tenancy/threads.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
TENANT_FACING = sorted(
    [
        *(ROOT / "app" / "mcp" / "tools").glob("*.py"),
        *(
            ROOT / "app" / "experiments" / f"{name}.py"
            for name in (
                "workspace/files",
                "execution",
                "commands",
                "creation",
                "workspace/dirs",
                "evidence/evidence",
                "disk_budget",
            )
        ),
    ]
)


@pytest.mark.parametrize("module", TENANT_FACING, ids=lambda path: path.stem)
def test_a_tenant_facing_module_never_uses_the_default_executor(module: Path) -> None:
    source = module.read_text()
    assert "to_thread" not in source, f"{module.relative_to(ROOT)}: use the call's in_thread"
    assert "run_in_executor(None" not in source


def test_the_list_is_not_empty() -> None:
    assert len(TENANT_FACING) > 6
    assert all(path.exists() for path in TENANT_FACING)
