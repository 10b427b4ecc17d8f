"""The pinned real clients installed by tests/e2e/clients/install.sh (npm).

Missing or wrong binaries fail the test that needs them, loudly: never a skip.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

CLIENTS = Path(__file__).resolve().parents[1] / "e2e" / "clients"
MODULES = CLIENTS / "node_modules"
NODE = MODULES / ".bin" / "node"
CLAUDE = MODULES / ".bin" / "claude"
TS_CLIENT = CLIENTS / "ts_client.mjs"
INSTALL = "bash tests/e2e/clients/install.sh"


def pinned(package: str) -> str:
    """The exact version tests/e2e/clients/package.json pins for ``package``."""
    manifest = json.loads((CLIENTS / "package.json").read_text())
    return str(manifest["dependencies"][package])


def installed(package: str) -> str:
    path = MODULES / package / "package.json"
    if not path.exists():
        pytest.fail(f"{package} is not installed: run `{INSTALL}`", pytrace=False)
    return str(json.loads(path.read_text())["version"])


def require(binary: Path, version_prefix: str) -> Path:
    """``binary`` exists and ``binary --version`` starts with ``version_prefix``."""
    if not binary.exists():
        pytest.fail(f"{binary} is missing: run `{INSTALL}`", pytrace=False)
    version = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, check=False, timeout=60
    ).stdout.strip()
    if not version.startswith(version_prefix):
        pytest.fail(
            f"{binary} is {version!r}, not {version_prefix}: run `{INSTALL}`", pytrace=False
        )
    return binary
