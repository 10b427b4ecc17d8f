"""What every group of settings shares, and the name rule that ties a field to its variable.

A field's variable is ``SANDBOX_MCP_`` plus its alias, or else its name, in upper
case: ``SmtpSettings.host`` has the alias ``smtp_host`` and is read from
``SANDBOX_MCP_SMTP_HOST``. The alias is also the key a group is validated by, so
a validation error's location names the variable.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo

ENV_PREFIX = "SANDBOX_MCP_"


class Group(BaseModel):
    """One concern's settings: frozen, unknown names refused, defaults validated too."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        validate_default=True,
        validate_by_alias=True,
        validate_by_name=True,  # tests may build a group with its fields' own names
    )


def variable_key(name: str, info: FieldInfo) -> str:
    """The field's variable without the prefix, in lower case (``smtp_host``)."""
    return info.alias or name
