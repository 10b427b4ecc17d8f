"""Every tunable of the service, read once from ``SANDBOX_MCP_*`` environment variables.

Domain code never reads ``os.environ``: the composition root validates a ``Settings``
at start-up and passes each part its group whole (``settings.pool``,
``settings.runtime``, ...), or the options a group's method builds from it
(``settings.smtp.options()``, ``settings.runtime.ceilings()``).

One module per group, named for its concern; ``model.py`` holds the whole, the rules
across groups and the reading of the environment; ``base.py`` the rule that names a
field's variable (``SANDBOX_MCP_`` plus its alias or name, upper-cased). Each field is
its own description.
"""

from app.settings.auth import AuthSettings
from app.settings.base import ENV_PREFIX
from app.settings.egress import EgressSettings
from app.settings.experiments import ExperimentSettings
from app.settings.mcp import McpSettings
from app.settings.model import (
    HARNESS_PREFIXES,
    Settings,
    SettingsError,
    load_settings,
    variables,
)
from app.settings.pool import PoolSettings
from app.settings.runtime import RuntimeSettings
from app.settings.server import LogLevel, ServerSettings
from app.settings.smtp import SmtpSettings
from app.settings.storage import StorageSettings
from jail.addresses import is_loopback_host

__all__ = [
    "ENV_PREFIX",
    "HARNESS_PREFIXES",
    "AuthSettings",
    "EgressSettings",
    "ExperimentSettings",
    "LogLevel",
    "McpSettings",
    "PoolSettings",
    "RuntimeSettings",
    "ServerSettings",
    "Settings",
    "SettingsError",
    "SmtpSettings",
    "StorageSettings",
    "is_loopback_host",
    "load_settings",
    "variables",
]
