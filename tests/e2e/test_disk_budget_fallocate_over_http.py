"""One fallocate cannot reserve past a dir slot's budget at once (issue 23, finding 6).

The budget of dir slots is measured, so it holds only if bytes arrive no faster than
they are written. ``fallocate`` reserved any number at once (4 GiB past a 32 MB
budget in one call), and with ``FALLOC_FL_KEEP_SIZE`` without even growing the file.
Now these containers' syscall filter refuses the allocating modes (EOPNOTSUPP, so
glibc's ``posix_fallocate`` falls back to writing) and ``RLIMIT_FSIZE`` stops a file
at the budget (app/runtime/docker/seccomp.py, app/runtime/docker/hardening.py).
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from disk_budget_testkit import (
    BUDGET_MB,
    SLACK_MB,
    code_of,
    new_experiment,
    slots_mb,
    start_budget_server,
)
from e2e_server import stop_server
from mcp_http import run_command, write_file
from oauth_browser import new_user

pytestmark = pytest.mark.e2e

RESERVE = 1 << 30  # 1 GiB, 32 times the budget
# util-linux's fallocate creates the file only in the plain mode
KEEP_SIZE = f"touch kept && fallocate --keep-size -l {RESERVE} kept; ls -ls kept"
# Each file under the budget (which RLIMIT_FSIZE alone would let through), 1 GiB in all.
MANY = f"for i in $(seq 64); do fallocate -l {RESERVE // 64} f$i; done; du -sh ."
POSIX = (
    "python3 -c \"import os; fd = os.open('reserved', os.O_CREAT | os.O_WRONLY); "
    f'os.posix_fallocate(fd, 0, {RESERVE})"'
)


async def test_one_fallocate_cannot_reserve_past_the_budget(tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = start_budget_server(state, pool_size=2)
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            mallory = await new_user(http, server.base_url)
            exp = await new_experiment(http, server, mallory)

            # Blocks beyond the end of the file: refused, nothing reserved.
            kept = await run_command(http, server, mallory, exp, KEEP_SIZE)
            print("fallocate --keep-size:", kept.get("stdout"), kept.get("stderr"))
            used = slots_mb(state)
            assert used < BUDGET_MB, f"{used:.0f} MB reserved by one fallocate --keep-size"

            # Many files, each under the budget: refused too.
            many = await run_command(http, server, mallory, exp, MANY)
            print("64 fallocates of 16 MiB:", many.get("stdout"), many.get("stderr", "")[-200:])
            used = slots_mb(state)
            assert used < BUDGET_MB, f"{used:.0f} MB reserved by 64 fallocates"

            # glibc's posix_fallocate: written instead, and stopped at the budget.
            posix = await run_command(http, server, mallory, exp, POSIX)
            print("posix_fallocate:", posix.get("exit_code"), posix.get("stderr"))
            used = slots_mb(state)
            print(f"slot after posix_fallocate of 1 GiB: {used:.1f} MB, budget {BUDGET_MB} MB")
            assert used < BUDGET_MB + SLACK_MB, f"{used:.0f} MB reserved by one posix_fallocate"
            refused = await write_file(http, server, mallory, exp, "more", "x")
            assert code_of(refused) == "QUOTA_EXCEEDED", refused
    finally:
        stop_server(server)
