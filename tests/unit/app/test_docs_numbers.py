"""The numbers the documentation states are the ones the code uses.

Two shapes of statement are read out of every page: a name followed by its value in
brackets, "`IDLE_TIMEOUT_S` (600)", "`client_lifetime` (1 hour)", and a value
followed by the name it belongs to, "10 a minute ... (`SIGNINS_PER_MINUTE`)",
"1 hour (`client_lifetime`)". A name is a setting (its default, from the settings
model), a directive of the squid.conf the server writes, or one of the code's own
bounds below; each such pair must agree. The configuration page's default column is
compared with the settings model field by field, and the egress allow-list the egress
page lists with the default one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from stated_limits import UNIT, number, stated_pairs

from app.egress.connlimit import MAX_CONNECTIONS as EGRESS_CONNECTIONS
from app.egress.rules import SquidPlan, squid_conf
from app.mcp.fit import STRUCTURED_BUDGET
from app.settings import ENV_PREFIX, Settings, load_settings

ROOT = Path(__file__).parents[3]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
CONFIGURATION = ROOT / "docs" / "configuration.md"

# Bounds that are constants of the code, not settings, under the name the docs give.
CONSTANTS: dict[str, int] = {
    "connlimit": EGRESS_CONNECTIONS,  # connections one container holds to the proxy
    "STRUCTURED_BUDGET": STRUCTURED_BUDGET,  # characters of one result's structured content
}


def squid_directives() -> dict[str, int]:
    plan = SquidPlan(
        listen="172.30.0.1:3128",
        workdir=Path("/run/sandbox-mcp/egress-x"),
        ceiling=("pypi.org",),
        not_public=("10.0.0.0/8",),
        helper=("/bin/true",),
    )
    found: dict[str, int] = {}
    for line in squid_conf(plan).splitlines():
        match = re.fullmatch(rf"([a-z_]+) (\d+(?: {UNIT})?)", line)
        if match:
            found[match.group(1)] = int(number(match.group(2)))
    return found


@pytest.fixture(scope="module")
def defaults() -> dict[str, Any]:
    """Every setting's default, keyed by its variable without the prefix, upper case."""
    with pytest.MonkeyPatch.context() as env:
        for name in list(os.environ):
            if name.startswith(ENV_PREFIX):
                env.delenv(name)
        settings: Settings = load_settings()
    values = {key.upper(): value for key, value in settings.by_variable(mode="json").items()}
    values["MAX_CONTAINERS"] = settings.effective_max_containers
    return values


def known(defaults: dict[str, Any]) -> dict[str, int | str]:
    values: dict[str, int | str] = {**CONSTANTS, **squid_directives()}
    for key, value in defaults.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            values[key] = int(value) if float(value).is_integer() else value  # type: ignore[assignment]
        elif isinstance(value, str) and re.fullmatch(r"\d+:\d+", value):
            values[key] = value
    return values


def agrees(stated: int | str, actual: int | str) -> bool:
    """Equal, or the uid of a ``uid:gid`` default ("uid 1000")."""
    if isinstance(actual, str) and isinstance(stated, int):
        return actual.split(":")[0] == str(stated)
    return stated == actual


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_stated_value_is_the_codes(page: Path, defaults: dict[str, Any]) -> None:
    values = known(defaults)
    wrong = [
        f"`{name}` ({value}): the code says {values[name]}"
        for name, value in stated_pairs(page.read_text())
        if name in values and not agrees(number(value), values[name])
    ]
    assert wrong == []


def test_the_pages_state_the_limits_a_tenant_meets(defaults: dict[str, Any]) -> None:
    """The check reads what it should: these pairs are there to compare (a change of
    wording that hid them from it would otherwise pass unseen)."""
    stated = {name for page in PAGES for name, _ in stated_pairs(page.read_text())}
    expected = {
        "SIGNINS_PER_MINUTE",
        "POOL_SIZE",
        "IDLE_TIMEOUT_S",
        "MAX_CALLS_PER_ADDRESS",
        "MAX_LISTEN_STREAMS",
        "MAX_LISTEN_STREAMS_PER_SANDBOX",
        "EGRESS_LOG_ROTATE_BYTES",
        "EGRESS_MAX_BYTES",
        "STRUCTURED_BUDGET",
        "connlimit",
        "client_lifetime",
        "read_timeout",
        "connect_timeout",
        "request_start_timeout",
        "client_idle_pconn_timeout",
        "request_header_max_size",
        "max_filedescriptors",
    }
    assert sorted(expected - stated) == []


# The default column: one literal, or a word for "no value"; a few are prose.
PROSE_DEFAULTS = {
    "DATABASE_URL",  # SQLite in the state dir
    "EGRESS_ALLOWLIST",  # listed on the egress page, compared below
    "PUBLIC_URL",  # http://HOST:PORT
    "STATE_DIR",  # ~/.sandbox-mcp, expanded by the model
    "TOKEN_KEY",  # a key file
}
NO_VALUE = {"unset": (None,), "empty": ("", [], None)}


def configuration_rows() -> list[tuple[str, str]]:
    row = rf"^\| `{ENV_PREFIX}([A-Z0-9_]+)` \| ([^|]*) \|"
    return [(n, d.strip()) for n, d in re.findall(row, CONFIGURATION.read_text(), re.M)]


def as_written(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_the_configuration_page_gives_each_settings_default(defaults: dict[str, Any]) -> None:
    rows = configuration_rows()
    assert {name for name, _ in rows} == set(defaults), "a row the default column misses"
    wrong = []
    for name, column in rows:
        if name in PROSE_DEFAULTS:
            continue
        value = defaults[name]
        if column in NO_VALUE:
            if value not in NO_VALUE[column]:
                wrong.append(f"{name}: {column}, the model says {value!r}")
            continue
        literals = re.findall(r"`([^`]*)`", column)
        assert literals, f"{name}: no default in {column!r}"
        shown = literals[-1] if name == "MAX_CONTAINERS" else literals[0]
        if shown != as_written(value):
            wrong.append(f"{name}: {shown}, the model says {as_written(value)}")
    assert wrong == []


def test_the_egress_page_lists_the_default_allowlist(defaults: dict[str, Any]) -> None:
    text = (ROOT / "docs" / "egress.md").read_text()
    match = re.search(r"By\s+default it is the public package registries: (.*?)\. ", text, re.S)
    assert match, "the egress page does not list the default allow-list"
    listed = re.findall(r"`([^`]+)`", match.group(1))
    assert listed == defaults["EGRESS_ALLOWLIST"].split(",")
