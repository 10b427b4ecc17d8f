"""The whole configuration: one group per concern, the rules across groups, and how the
flat ``SANDBOX_MCP_*`` environment fills the groups.

``load_settings`` reads and validates every variable in one pass, so an operator with
three bad values (in any groups) is told all three in one start. A rule inside a group
(a default image in the allow-list) runs once that group's fields are valid; a rule
across groups (containers for every slot, local mode on loopback only) once every
group is.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from pydantic import SecretStr, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from app.settings.auth import AuthSettings
from app.settings.base import ENV_PREFIX, Group, variable_key
from app.settings.egress import EgressSettings
from app.settings.experiments import ExperimentSettings
from app.settings.mcp import McpSettings
from app.settings.pool import PoolSettings
from app.settings.runtime import RuntimeSettings
from app.settings.server import ServerSettings
from app.settings.smtp import SmtpSettings
from app.settings.storage import StorageSettings
from jail.addresses import is_loopback_host

# Variables of the test harness, not settings (the image build's are SANDBOX_IMAGE_*).
HARNESS_PREFIXES = (ENV_PREFIX + "TEST_", ENV_PREFIX + "CI_")


class SettingsError(Exception):
    """The environment holds a value the service cannot start with.

    ``lines`` has one human sentence per bad variable, naming the variable, the
    value it had and what is allowed.
    """

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


class Settings(BaseSettings):
    """The service's configuration, each concern a group passed down whole."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True)

    server: ServerSettings
    storage: StorageSettings
    pool: PoolSettings
    runtime: RuntimeSettings
    experiments: ExperimentSettings
    egress: EgressSettings
    auth: AuthSettings
    smtp: SmtpSettings
    mcp: McpSettings

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Keyword values win over the environment; no .env file, no secrets dir.
        return init_settings, _FlatEnvironment(settings_cls)

    @model_validator(mode="after")
    def _every_slot_can_have_a_container(self) -> Settings:
        cap, size = self.runtime.max_containers, self.pool.size
        if cap is not None and cap < size:
            raise ValueError(
                f"SANDBOX_MCP_MAX_CONTAINERS={cap} is below "
                f"SANDBOX_MCP_POOL_SIZE={size}: every sandbox the pool hands out "
                "must be able to run one experiment, so the server keeps a container for each "
                f"slot; set SANDBOX_MCP_MAX_CONTAINERS to at least {size} (unset, "
                "it is twice the pool size) or lower SANDBOX_MCP_POOL_SIZE"
            )
        return self

    @model_validator(mode="after")
    def _auth_none_only_on_loopback(self) -> Settings:
        host = self.server.host
        if self.auth.mode == "none" and not is_loopback_host(host):
            raise ValueError(
                f"SANDBOX_MCP_AUTH='none' is allowed only when SANDBOX_MCP_HOST is loopback "
                f"(it is {host!r}): without sign-in every caller would share one sandbox"
            )
        return self

    @property
    def effective_max_containers(self) -> int:
        return self.runtime.container_cap(self.pool.size)

    def by_variable(self, *, mode: str = "python") -> dict[str, Any]:
        """Every value keyed by its variable's name without the prefix (``smtp_host``)."""
        flat: dict[str, Any] = {}
        for group in type(self).model_fields:
            flat.update(getattr(self, group).model_dump(mode=mode, by_alias=True))
        return flat

    def with_overrides(self, **changes: object) -> Settings:
        """A validated copy with some values replaced, named as ``load_settings`` takes them.

        Raises:
            SettingsError: a replaced value is invalid.
        """
        flat = self.by_variable()
        flat.update({k: v for k, v in changes.items() if v is not None})
        return _validate(flat)


def variables() -> tuple[str, ...]:
    """Every setting's variable, ``SANDBOX_MCP_...``."""
    return tuple(ENV_PREFIX + key.upper() for key in _group_of())


def load_settings(**overrides: object) -> Settings:
    """Read and validate the configuration from the process environment.

    Args:
        overrides: values that take precedence over the environment (CLI flags), each
            named as its variable without the prefix, in lower case (``port=9100``).

    Raises:
        SettingsError: a value is invalid or a ``SANDBOX_MCP_*`` variable is unknown,
            with one line per problem.
    """
    known = set(variables())
    unknown = sorted(
        name
        for name in os.environ
        if name.startswith(ENV_PREFIX)
        and name not in known
        # Not ours: the test suite passes its service addresses as SANDBOX_MCP_TEST_*,
        # and .ci/run takes its own knobs as SANDBOX_MCP_CI_*.
        and not name.startswith(HARNESS_PREFIXES)
    )
    if unknown:
        raise SettingsError([f"{name} is not a setting of sandbox-mcp" for name in unknown])
    return _validate({k: v for k, v in overrides.items() if v is not None})


@functools.cache
def _group_of() -> dict[str, str]:
    """Each variable's key (``smtp_host``) and the group that declares it (``smtp``)."""
    return {
        variable_key(name, info): group
        for group, model in _groups().items()
        for name, info in model.model_fields.items()
    }


def _groups() -> dict[str, type[Group]]:
    return {name: info.annotation for name, info in Settings.model_fields.items()}  # type: ignore[misc]


def _nest(flat: dict[str, object]) -> dict[str, dict[str, object]]:
    nested: dict[str, dict[str, object]] = {group: {} for group in Settings.model_fields}
    for key, value in flat.items():
        group = _group_of().get(key)
        if group is None:
            raise TypeError(f"{key!r} is not a setting (SANDBOX_MCP_{key.upper()})")
        nested[group][key] = value
    return nested


class _FlatEnvironment(PydanticBaseSettingsSource):
    """``SANDBOX_MCP_<KEY>`` (any case, as pydantic-settings reads) filed under its group."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every variable at once

    def __call__(self) -> dict[str, Any]:
        prefix = ENV_PREFIX.lower()
        flat: dict[str, object] = {
            key: value
            for name, value in os.environ.items()
            if name.lower().startswith(prefix)
            and (key := name.lower()[len(prefix) :]) in _group_of()
        }
        return _nest(flat)


def _validate(flat: dict[str, object]) -> Settings:
    try:
        return Settings(**_nest(flat))  # type: ignore[arg-type]
    except ValidationError as exc:
        raise SettingsError(_describe(exc, flat)) from None


def _describe(exc: ValidationError, flat: dict[str, object]) -> list[str]:
    lines = []
    for error in exc.errors(include_url=False):
        message = error["msg"].removeprefix("Value error, ")
        if len(error["loc"]) < 2:
            # A rule across fields (of a group, or of groups): its message names the variables.
            lines.append(message)
            continue
        key = str(error["loc"][1])
        variable = f"{ENV_PREFIX}{key.upper()}"
        shown = flat.get(key, os.environ.get(variable, "<unset>"))
        if key in _secret_keys():
            shown = "<hidden>"
        lines.append(f"{variable}={shown!r} is invalid: {message}")
    return lines


@functools.cache
def _secret_keys() -> frozenset[str]:
    """Every SecretStr setting: its value never appears in an error line."""
    return frozenset(
        variable_key(name, info)
        for model in _groups().values()
        for name, info in model.model_fields.items()
        if info.annotation in (SecretStr, SecretStr | None)
    )
