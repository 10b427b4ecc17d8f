"""The scripts' variables and the server's settings never collide.

Seen: SANDBOX_MCP_DEBIAN_MIRROR, SANDBOX_MCP_IMAGE_CACHE and SANDBOX_MCP_NPM_SPEC,
exported for deploy/build-base-image, made `serve` and `check` refuse to start
("is not a setting of sandbox-mcp"). The build's variables are SANDBOX_IMAGE_* now,
and .ci/run's own knobs (SANDBOX_MCP_CI_*) are ignored by the server.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from e2e_server import start_server, stop_server

from app.settings import HARNESS_PREFIXES, variables

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = [
    *sorted(p for p in (ROOT / "deploy").rglob("*") if p.is_file()),
    *sorted(p for p in (ROOT / ".ci").rglob("*") if p.is_file()),
    ROOT / "Dockerfile",
]
# What an operator exports before building the images and running CI.
SCRIPT_ENV = {
    "SANDBOX_IMAGE_DEBIAN_MIRROR": "http://deb.debian.org/debian",
    "SANDBOX_IMAGE_CACHE": "/var/cache/sandbox-mcp",
    "SANDBOX_IMAGE_NODE22_SPEC": "22",
    "SANDBOX_IMAGE_NPM_SPEC": "10",
    "SANDBOX_MCP_CI_TIMEOUT": "60",
    "SANDBOX_MCP_CI_EXTRA_PACKAGES": "jq",
}


def test_every_sandbox_mcp_name_a_script_reads_is_a_setting_or_the_harness_s() -> None:
    names = {
        name
        for script in SCRIPTS
        for name in re.findall(r"\bSANDBOX_MCP_[A-Z0-9_]+", script.read_text(errors="replace"))
    }
    assert "SANDBOX_MCP_CI_TIMEOUT" in names, "the scan reads the scripts"
    colliding = sorted(
        name for name in names if not name.startswith(HARNESS_PREFIXES) and name not in variables()
    )
    assert colliding == []


def test_check_runs_with_the_scripts_variables_exported(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app", "check"],
        env={**os.environ, **SCRIPT_ENV, "SANDBOX_MCP_STATE_DIR": str(tmp_path / "state")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "not a setting" not in done.stderr
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True


def test_serve_starts_with_the_scripts_variables_exported(tmp_path: Path) -> None:
    server = start_server(tmp_path / "state", SANDBOX_MCP_POOL_SIZE="1", **SCRIPT_ENV)
    try:
        assert httpx2.get(f"{server.base_url}/health", timeout=5).status_code == 200
    finally:
        stop_server(server)
