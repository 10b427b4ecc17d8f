"""The numbers the documentation states are the ones the code uses.

Two shapes of statement are read out of every page: a name followed by its value in
brackets, "`IDLE_TIMEOUT_S` (600)", "`client_lifetime` (1 hour)", and a value
followed by the name it belongs to, "10 a minute ... (`SIGNINS_PER_MINUTE`)",
"1 hour (`client_lifetime`)". A name is a setting (its default, from the settings
model), a directive of the squid.conf the server writes, or one of the code's own
bounds below; each such pair must agree. The configuration page's default column is
compared with the settings model field by field, and the egress allow-list the egress
page lists with the default one. A name the check does not know is a failure, not a
skip (``NOT_CHECKED`` lists the few that are not the code's numbers), and so is a name
with a number beside it in a shape the reader misses. The defaults the README and the
tools page state without a name ("1 CPU, 1024 MB of memory, 600 s per command") are
compared with what an experiment gets when it asks for nothing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from stated_limits import NAME_THEN_VALUE, UNIT, number, stated_pairs

from app.egress import connlimit as egress_connlimit
from app.egress.rules import SquidPlan, squid_conf
from app.experiments import disk_budget, output_budget, removals, views
from app.experiments.evidence import shelf
from app.experiments.evidence.readers import _common as report_common
from app.experiments.evidence.readers.junit import (  # the package's `junit` is its reader function
    FEED_BYTES,
    MAX_DEPTH,
    MAX_ELEMENTS,
    MAX_TEST_CASES,
    MAX_TOKEN_BYTES,
)
from app.experiments.recovery import recovery
from app.mcp import fit, request_bounds, resources
from app.mcp.tasks import extension as tasks
from app.mcp.tools import seed_names
from app.root.experiments import experiment_options
from app.runtime.backend import Limits
from app.runtime.exec import protocol as fast_exec
from app.runtime.git import clone as _clone
from app.runtime.git import egress as git_egress
from app.runtime.warm import prepared
from app.settings import ENV_PREFIX, Settings, load_settings
from app.storage import rate_store, sqlite_writes
from app.storage.signin import auth_admissions, front_door
from auth.client_documents import LOOKUP_WAIT_S
from auth.safe_fetch import LOOKUP_THREADS
from jail import pack as packs
from pool import queue as pool_queue

ROOT = Path(__file__).parents[3]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
CONFIGURATION = ROOT / "docs" / "configuration.md"

# Bounds that are constants of the code, not settings, under the name the docs give
# (read through their modules: a constant renamed or moved fails here, not silently).
CONSTANTS: dict[str, int | float] = {
    "connlimit": egress_connlimit.MAX_CONNECTIONS,  # one container's connections to the proxy
    "STRUCTURED_BUDGET": fit.STRUCTURED_BUDGET,  # characters of one result's structured content
    "MAX_RESULT_CHARS": fit.MAX_RESULT_CHARS,  # one result's text and structured content
    # a JUnit report, read as a stream
    "MAX_DEPTH": MAX_DEPTH,
    "MAX_ELEMENTS": MAX_ELEMENTS,
    "MAX_TEST_CASES": MAX_TEST_CASES,
    "MAX_TOKEN_BYTES": MAX_TOKEN_BYTES,
    "FEED_BYTES": FEED_BYTES,
    "MAX_JSON_VALUES": report_common.MAX_JSON_VALUES,  # a jest/vitest JSON report
    "MAX_KEPT_FAILING": report_common.MAX_KEPT_FAILING,
    # the executor stream
    "EVENTS_PER_S": fast_exec.EVENTS_PER_S,
    "BYTES_PER_S": fast_exec.BYTES_PER_S,
    "READS_PER_S": fast_exec.READS_PER_S,
    "STDERR_MAX": fast_exec.STDERR_MAX,
    # request bodies measured before the SDK parses them
    "LARGE_BODY": request_bounds.LARGE_BODY,
    "MAX_VALUES": request_bounds.MAX_VALUES,
    "MAX_ESCAPES": request_bounds.MAX_ESCAPES,
    "LARGE_PER_ADDRESS": request_bounds.LARGE_PER_ADDRESS,
    "MAX_BATCH": rate_store.MAX_BATCH,  # the shared rate ledger's takes a transaction
    "MAX_ADMISSIONS": auth_admissions.MAX_ADMISSIONS,  # the sign-in's presses a transaction
    "MAX_ASKS": pool_queue.MAX_ASKS,  # first leases (and queue places) a transaction
    "HOLD_MAX_S": prepared.HOLD_MAX_S,  # a prepared creation's wait for a lull in creates
    "FRONT_DOOR_CONNECTIONS": front_door.FRONT_DOOR_CONNECTIONS,  # the sign-in's own
    "TURN_WAIT_S": sqlite_writes.TURN_WAIT_S,  # a SQLite writer's wait for its turn
    # reads, views and the logs resource
    "ARTIFACT_PART_BYTES": shelf.ARTIFACT_PART_BYTES,
    "MAX_LISTED_JOBS": views.MAX_LISTED_JOBS,
    "JOB_ROW_BYTES": output_budget.JOB_ROW_BYTES,  # a stored job row, charged with its texts
    "TRASH_WAIT_S": disk_budget.TRASH_WAIT_S,  # a sandbox over budget waits for its trash
    "STALE_CREATION_S": recovery.STALE_CREATION_S,  # a creation still CREATING is retired
    "MAX_LISTED_COMMAND_CHARS": views.MAX_LISTED_COMMAND_CHARS,
    "MAX_LOG_CHARS": resources.MAX_LOG_CHARS,
    # a clone's output and its lookups
    "MAX_SCANNED_CHARS": git_egress.MAX_SCANNED_CHARS,
    "LOOKUPS_PER_SANDBOX": git_egress.LOOKUPS_PER_SANDBOX,
    "LOOKUPS_PER_ADDRESS": git_egress.LOOKUPS_PER_ADDRESS,
    "RESOLVE_TIMEOUT_S": git_egress.RESOLVE_TIMEOUT_S,
    "pollIntervalMs": tasks.POLL_INTERVAL_MS,  # the field a task handle carries
    # the metadata-document fetcher's DNS threads, and how long a fetch waits for its share
    "LOOKUP_THREADS": LOOKUP_THREADS,
    "LOOKUP_WAIT_S": LOOKUP_WAIT_S,
    # an experiment's baseline pack
    "MAX_PACK_ENTRIES": packs.MAX_PACK_ENTRIES,
    "MAX_PACK_INDEX_BYTES": packs.MAX_PACK_INDEX_BYTES,
    # destroyed experiments' containers, removed after the answer
    "MAX_PENDING_PER_SANDBOX": removals.MAX_PENDING_PER_SANDBOX,
    "REMOVAL_WAIT_S": removals.REMOVAL_WAIT_S,
}

# Backticked names beside a number that are not the code's bounds, each with why.
NOT_CHECKED = {
    "GIT_LIMITS": "several values at once: test_the_clone_helper_s_limits_are_the_stated_ones",
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
    values: dict[str, int | str] = {**squid_directives()}
    for key, value in [*CONSTANTS.items(), *defaults.items()]:
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
    pairs = stated_pairs(page.read_text())
    unknown = sorted({name for name, _ in pairs if name not in values} - set(NOT_CHECKED))
    assert unknown == [], "a stated name the check does not know: add it to CONSTANTS"
    wrong = [
        f"`{name}` ({value}): the code says {values[name]}"
        for name, value in pairs
        if name in values and not agrees(number(value), values[name])
    ]
    assert wrong == []


# A backticked name with a number right after it: "`NAME` 64", "`NAME` (64", "`NAME`, 64".
NAME_BESIDE_NUMBER = re.compile(rf"`(?:{ENV_PREFIX})?([A-Za-z][A-Za-z0-9_]*)`,? \(?\d")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_number_beside_a_name_is_read_as_its_value(page: Path) -> None:
    """Once "`MAX_DEPTH` 64" was read as nothing, and "8192 frames, 64 MiB and 256 reads a
    second (`EVENTS_PER_S`, `BYTES_PER_S`, `READS_PER_S`)" as 256 for all three: a value
    must sit beside its own name, in brackets, where the check reads it."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    missed = [
        " ".join(text[found.start() : found.end() + 20].split())
        for found in NAME_BESIDE_NUMBER.finditer(text)
        if found.group(1) not in NOT_CHECKED and not NAME_THEN_VALUE.match(text, found.start())
    ]
    assert missed == [], "write `NAME` (value), or value (`NAME`)"


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
        *CONSTANTS,  # every bound of the code's own is stated where the check reads it
    }
    assert sorted(expected - stated) == []


def what_an_experiment_gets() -> dict[str, int | str]:
    """What ``create_experiment`` gives when it asks for nothing, from the code: the
    tool's ``Limits()`` and the options the server builds from default settings."""
    with pytest.MonkeyPatch.context() as env:
        for name in list(os.environ):
            if name.startswith(ENV_PREFIX):
                env.delenv(name)
        options = experiment_options(load_settings())
    limits = Limits()
    return {
        "cpus": int(limits.cpus),
        "memory_mb": limits.memory_mb,
        "pids": limits.pids,
        "tmp_mb": limits.tmp_mb,
        "timeout_s": int(options.default_timeout_s),
        "image": options.default_image,
        "network": seed_names.network(None, None),
    }


def test_the_readme_states_what_an_experiment_gets_by_default() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    match = re.search(
        r"an experiment gets (\d+) CPU, (\d+) MB of memory, (\d+) s per command, no network"
        r" and the `([^`]+)` image",
        text,
    )
    assert match, "README no longer states an experiment's defaults where this test reads them"
    cpus, memory_mb, timeout_s, image = match.groups()
    code = what_an_experiment_gets()
    assert (int(cpus), int(memory_mb), int(timeout_s), image) == (
        code["cpus"],
        code["memory_mb"],
        code["timeout_s"],
        code["image"],
    )
    assert code["network"] == "none"  # "no network"


def test_the_tools_page_states_what_an_experiment_gets_by_default() -> None:
    page = (ROOT / "docs" / "tools.md").read_text()
    table = page.split("## What an experiment gets by default")[1]
    column = dict(re.findall(r"^\| ([^|]+?) \| ([^|]*?) \|", table, re.M))
    code = what_an_experiment_gets()
    stated = {
        "cpus": column["CPU"],
        "memory_mb": column["memory"],
        "pids": column["processes"],
        "tmp_mb": column["`/tmp` and the home folder"],
        "timeout_s": column["a command's wall clock"],
    }
    first = {key: int(value.split()[0]) for key, value in stated.items()}  # "1024 MB, no swap"
    assert first == {key: code[key] for key in stated}
    assert column["network"] == f"`{code['network']}`"
    assert f"(`{code['image']}`)" in column["image"]


def test_the_clone_helper_s_limits_are_the_stated_ones() -> None:
    text = " ".join((ROOT / "docs" / "ARCHITECTURE.md").read_text().split())
    match = re.search(
        r"`GIT_LIMITS` \((\d+) CPU, (\d+) MB, (\d+) processes, (\d+) MB of /tmp\)", text
    )
    assert match, "ARCHITECTURE.md no longer states GIT_LIMITS where this test reads them"
    limits = _clone.GIT_LIMITS
    stated = tuple(int(value) for value in match.groups())
    assert stated == (int(limits.cpus), limits.memory_mb, limits.pids, limits.tmp_mb)


def test_the_readme_samples_and_image_commands_use_the_defaults(defaults: dict[str, Any]) -> None:
    """The /health answer and the start-up line the README shows are a default start's
    (a pool of POOL_SIZE slots), and the state folder it makes is the image's user's."""
    readme = (ROOT / "README.md").read_text()
    sizes = re.findall(r'"size":(\d+)|"pool_size": (\d+)', readme)
    assert len(sizes) == 2
    assert {int(a or b) for a, b in sizes} == {defaults["POOL_SIZE"]}
    [uid] = re.findall(r"useradd --system --uid (\d+)", (ROOT / "Dockerfile").read_text())
    assert f'chown {uid} "$STATE"' in readme


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
