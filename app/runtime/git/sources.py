"""Git sources: which may be cloned into a workspace, and the script the clone helper runs.

Checked on the host, before any container starts:

* a remote URL is ``https://host/path`` and nothing else: no other transport
  (``http``, ``git``, ``ssh``, ``file``, ``ext::`` and other ``<helper>::``
  remotes run commands or reach further than asked), no credentials in it, no
  characters a URL cannot hold unencoded (control characters, spaces, quotes),
  no encoded control characters (git decodes them for its credential
  protocol, CVE-2020-5260), nothing that looks like an option;
* a ref is a plain ref name (``[A-Za-z0-9._/-]``, none of the forms
  ``git check-ref-format`` refuses), so it can never be read as an option or
  a revision expression;
* a local path (local mode only; the app decides) is an existing folder
  outside the slots base, and does not contain it: a helper must never read
  another slot.

The script runs as the sandbox user in the hardened helper (see
``DockerBackend.clone``), with the values shell-quoted. Every git call gets:
no hooks (``core.hooksPath=/dev/null``: not even the new clone's
``post-checkout``), an empty template (no sample hooks copied), only the one
transport needed (``protocol.allow=never`` and the environment's
``GIT_ALLOW_PROTOCOL``, which also bound redirects and submodule URLs), no
submodules, every received object checked (``transfer.fsckObjects``: trees
with ``.git`` or ``..`` entries are refused), no credential helper and no
prompt, and no system or global configuration but the ``safe.directory``
entry local mode needs (the mounted repository belongs to another user).
Symbolic links are checked out as links: they stay in the workspace, and the
jail never follows them.

A remote clone connects only to the public address checked and pinned by
:mod:`app.runtime.git.egress`, follows no redirect, and is shallow
(``--depth 1``): the egress window stays short. A
local clone keeps the whole history (it costs no network, and the sandbox can
never fetch it later), through the pack protocol (``--no-local``): no
hardlinks or object copies out of the mounted repository. A ref that may be a
commit is first tried as a branch or tag; if that fails, the full history is
cloned without a checkout and the commit is checked out detached.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from app.runtime.backend import GitSource
from app.runtime.docker.workspace import refuse_docker_socket
from app.runtime.errors import GitSourceField, GitSourceRefused, WorkspaceRefused

SOURCE: Final = "/source"  # where a local repository is mounted, read-only
TARGET: Final = "/workspace"
MAX_URL: Final = 2048
MAX_REF: Final = 200

# RFC 3986's characters; anything else (whitespace, control characters, quotes,
# backslashes, ...) would have to be percent-encoded in a real URL.
_URL_CHARS = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+")
_ENCODED_CONTROL = re.compile(r"%(?:[01][0-9a-fA-F]|7[fF])")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_REF = re.compile(r"[A-Za-z0-9._/-]+")
_MAYBE_COMMIT = re.compile(r"[0-9a-fA-F]{4,40}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_KNOWN_SCHEMES = frozenset(
    {"http", "git", "ssh", "git+ssh", "ssh+git", "file", "ftp", "ftps", "rsync"}
)

# Every git call in the helper; ``git -c`` (unlike ``git clone -c``) is not
# written into the new repository, so the sandbox's own git use is unchanged.
_CONFIG: Final = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.symlinks=true",
    "transfer.fsckObjects=true",
    "submodule.recurse=false",
    "fetch.recurseSubmodules=false",
    "protocol.allow=never",
    "credential.helper=",
    # A redirect's host would be resolved afresh, past the pinned address.
    "http.followRedirects=false",
    "advice.detachedHead=false",
)


@dataclass(frozen=True)
class ClonePlan:
    """A checked git source: what the helper clones, and what it mounts."""

    url: str  # what git clones from: the https URL, or SOURCE
    ref: str | None
    local_source: Path | None = None  # the host folder to mount read-only at SOURCE
    # host:443:address, the checked address git must connect to (app.runtime.git.egress)
    pin: str | None = None

    @property
    def protocol(self) -> str:
        return "https" if self.local_source is None else "file"


def check_url(url: str) -> str:
    """Return ``url`` if it is a plain ``https://`` URL without credentials, else raise.

    Raises:
        GitSourceRefused: anything else (see the module doc).
    """
    _check_argument("url", url, MAX_URL)
    if _CONTROL.search(url):
        raise GitSourceRefused("url", "it holds control characters")
    if not _URL_CHARS.fullmatch(url):
        raise GitSourceRefused("url", "it holds characters a URL must percent-encode")
    if _ENCODED_CONTROL.search(url):
        raise GitSourceRefused("url", "it holds encoded control characters")
    scheme, separator, _ = url.partition("://")
    if "::" in scheme:
        raise GitSourceRefused("url", "git remote helpers ('<transport>::') are not allowed")
    if scheme != "https" or not separator:
        # Named only when it is a known scheme: the text may be anything, even a password.
        known = scheme if separator and scheme in _KNOWN_SCHEMES else None
        reason = f"{known}:// is not allowed" if known else "it is not an https:// URL"
        raise GitSourceRefused("url", f"{reason}; only https:// URLs can be cloned")
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise GitSourceRefused("url", "credentials or a user name in the URL")
    host, colon, port = parts.netloc.partition(":")
    if not _HOST.fullmatch(host):
        raise GitSourceRefused("url", "its host is not a host name")
    if colon and not (port.isdecimal() and len(port) <= 5 and 0 < int(port) < 65536):
        raise GitSourceRefused("url", "its port is not a port number")
    if parts.path.strip("/") == "":
        raise GitSourceRefused("url", "it names no repository")
    return url


def check_ref(ref: str) -> str:
    """Return ``ref`` if it is a plain branch, tag or commit name, else raise.

    Raises:
        GitSourceRefused: not ``[A-Za-z0-9._/-]``, empty or longer than
            MAX_REF, a leading ``-``, ``..``, an empty or dot-led component,
            a leading or trailing ``/``, a trailing ``.`` or ``.lock``.
    """
    _check_argument("ref", ref, MAX_REF)
    if not _REF.fullmatch(ref):
        raise GitSourceRefused("ref", "only letters, digits, '.', '_', '/' and '-' are allowed")
    if ".." in ref:
        raise GitSourceRefused("ref", "'..' is not allowed")
    components = ref.split("/")
    if any(not c or c.startswith(".") or c.endswith(".lock") for c in components):
        raise GitSourceRefused(
            "ref", "a '/'-separated part is empty, starts with '.' or ends with '.lock'"
        )
    if ref.endswith("."):
        raise GitSourceRefused("ref", "it ends with '.'")
    return ref


def _check_argument(field: GitSourceField, value: str, max_chars: int) -> None:
    """What a URL and a ref both must be: a non-empty string of at most ``max_chars``
    that git cannot take for an option."""
    if not isinstance(value, str) or not value:
        raise GitSourceRefused(field, "it is empty")
    if len(value) > max_chars:
        raise GitSourceRefused(field, f"longer than {max_chars} characters")
    if value.startswith("-"):
        raise GitSourceRefused(field, "it starts with '-', like an option")


def check_local_path(local_path: Path, slots_base: Path) -> Path:
    """Return the real path of a local repository folder to mount, or raise.

    Raises:
        GitSourceRefused: not absolute, missing, not a folder, inside the
            slots base or containing it, or holding the Docker socket.
    """
    if not local_path.is_absolute():
        raise GitSourceRefused("local_path", "not an absolute path")
    real = Path(os.path.realpath(local_path))
    try:
        if not real.is_dir():
            raise GitSourceRefused("local_path", "not an existing folder")
    except OSError as exc:
        raise GitSourceRefused(
            "local_path", f"the folder cannot be inspected ({exc.strerror})"
        ) from None
    base = Path(os.path.realpath(slots_base))
    if real == base or base in real.parents:
        raise GitSourceRefused("local_path", "it lies inside the sandboxes' storage")
    if real in base.parents:
        raise GitSourceRefused("local_path", "it contains the sandboxes' storage")
    try:
        refuse_docker_socket([str(real)])
    except WorkspaceRefused as exc:
        raise GitSourceRefused("local_path", str(exc.details["reason"])) from None
    return real


def plan_clone(source: GitSource, slots_base: Path) -> ClonePlan:
    """Check a git source (blocking: it may inspect the host's disk).

    Raises:
        GitSourceRefused: see :func:`check_url`, :func:`check_ref`, :func:`check_local_path`.
    """
    ref = None if source.ref is None else check_ref(source.ref)
    if source.local_path is not None:
        return ClonePlan(SOURCE, ref, check_local_path(source.local_path, slots_base))
    return ClonePlan(check_url(source.url), ref)


def require_empty(workspace: Path) -> None:
    """Raise unless ``workspace`` (an already checked folder) is empty.

    Raises:
        WorkspaceRefused: it holds something.
    """
    with os.scandir(workspace) as entries:
        if next(entries, None) is not None:
            raise WorkspaceRefused("the folder must be empty to clone into it")


def clone_env(plan: ClonePlan) -> dict[str, str]:
    """The helper's environment (besides ``HOME``)."""
    return {
        "GIT_ALLOW_PROTOCOL": plan.protocol,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C.UTF-8",
    }


def clone_script(plan: ClonePlan) -> str:
    """The ``sh -c`` script that clones ``plan`` into TARGET (values shell-quoted)."""
    config = [*_CONFIG, f"protocol.{plan.protocol}.allow=always"]
    if plan.pin is not None:
        config.append(f"http.curloptResolve={plan.pin}")
    git = "git " + " ".join(f"-c {shlex.quote(c)}" for c in config)
    url, target = shlex.quote(plan.url), shlex.quote(TARGET)
    if plan.local_source is None:
        full, first = "g clone --template=", "g clone --template= --depth=1"
    else:
        full = first = "g clone --template= --no-local"
    lines = ["set -u"]
    if plan.local_source is not None:
        # The repository belongs to someone else on the host; safe.directory is
        # honoured only from the global file (here in the helper's own tmpfs home).
        lines += [
            f"git config --global --add safe.directory {SOURCE} || exit 125",
            f"git config --global --add safe.directory {SOURCE}/.git || exit 125",
        ]
    lines.append(f'g() {{ {git} "$@"; }}')
    if plan.ref is None:
        lines.append(f"{first} -- {url} {target}")
        return "\n".join(lines)
    ref = shlex.quote(plan.ref)
    if not _MAYBE_COMMIT.fullmatch(plan.ref):
        lines.append(f"{first} --branch {ref} -- {url} {target}")
        return "\n".join(lines)
    note = shlex.quote(
        f"sandbox-mcp: {plan.ref} is not a branch or a tag there; "
        "cloning the whole history to check it out as a commit"
    )
    lines += [
        f"{first} --branch {ref} -- {url} {target} && exit 0",
        # A failed clone empties the folder; anything else must not be mixed into.
        f'[ -z "$(ls -A {target})" ] || exit 1',
        f"printf '%s\\n' {note} >&2",
        f"{full} --no-checkout -- {url} {target} &&",
        f"g -C {target} checkout --detach {ref} --",
    ]
    return "\n".join(lines)
