"""The running service's version, as installed (``0+unknown`` from a bare source tree)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version


def service_version() -> str:
    try:
        return package_version("sandbox-mcp")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"
