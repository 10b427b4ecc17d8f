"""Which environment variables reach a sandbox container.

The host environment is never inherited. A request ``NAME`` forwards the
host's value of NAME; ``NAME=value`` injects a literal. While ``strict`` (the
default; the app maps SANDBOX_MCP_STRICT_ENV_DENYLIST=false to strict=False),
credential-shaped names are refused in both forms: the rule is "no
credential-named variable enters a sandbox", which is simple to state and to
audit. The server's own settings (SANDBOX_MCP_*) are refused even then.

Values are never logged, stored or echoed: messages name variables only, and a
request that is not a valid name is referred to by its position, since it may
be a value pasted in the wrong place.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from jail.errors import JailError

__all__ = ["is_credential_shaped", "resolve_env"]

MAX_REQUESTS = 128
MAX_NAME_LENGTH = 128
MAX_VALUE_BYTES = 32 * 1024

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Matched on the upper-cased name.
_WORDS = frozenset({"TOKEN", "TOKENS", "JWT", "COOKIE", "COOKIES"})  # whole "_" words
_FRAGMENTS = (
    "API_KEY",
    "APIKEY",
    "ACCESS_KEY",
    "PRIVATE_KEY",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "DATABASE_URL",
    "CONNECTION_STRING",
)
_SUFFIXES = ("_KEY", "_KEYS", "_PAT", "_DSN", "_PASS", "_PWD")
_PREFIXES = ("AWS_",)
_EXACT = frozenset(
    {
        "REDIS_URL",
        "MONGODB_URI",
        "MONGO_URL",
        "AMQP_URL",
        "NETRC",
        "PGPASSFILE",
        "KUBECONFIG",
        # Agent sockets and helpers hand out the host user's keys.
        "SSH_AUTH_SOCK",
        "GPG_AGENT_INFO",
        "GIT_ASKPASS",
        "SSH_ASKPASS",
        "SUDO_ASKPASS",
        # These would point a sandbox at the server's own Docker daemon.
        "DOCKER_HOST",
        "DOCKER_CONFIG",
        "DOCKER_CERT_PATH",
        "DOCKER_AUTH_CONFIG",
    }
)
_ALWAYS_REFUSED_PREFIXES = ("SANDBOX_MCP_",)


def is_credential_shaped(name: str) -> bool:
    """Whether ``name`` looks like it holds a credential (case-insensitive).

    ``TOKEN`` counts as a whole word only, so ``TOKENIZERS_PARALLELISM`` passes
    while ``GITHUB_TOKEN`` and ``TOKEN_URL`` do not.
    """
    upper = name.upper()
    return (
        upper in _EXACT
        or upper.startswith(_PREFIXES)
        or upper.endswith(_SUFFIXES)
        or any(fragment in upper for fragment in _FRAGMENTS)
        or not _WORDS.isdisjoint(upper.split("_"))
    )


def resolve_env(
    requests: Sequence[str], host_env: Mapping[str, str], *, strict: bool = True
) -> dict[str, str]:
    """The environment for a container, from the caller's requests only.

    Args:
        requests: ``NAME`` (forward the host's value) or ``NAME=value`` (literal).
        host_env: the values ``NAME`` requests may forward. In hosted mode the
            app should pass an empty mapping: a tenant has no business with
            the server's environment.
        strict: refuse credential-shaped names (see ``is_credential_shaped``).

    Raises:
        JailError: ENV_NAME_REFUSED for a refused name; ENV_INVALID for a
            malformed or duplicate request, a NUL byte, an oversized value,
            or a forwarded name the host does not set.
    """
    if len(requests) > MAX_REQUESTS:
        raise _invalid(f"At most {MAX_REQUESTS} environment variables may be requested.")
    env: dict[str, str] = {}
    for position, request in enumerate(requests, start=1):
        if not isinstance(request, str):
            raise _invalid(f"Environment request #{position} is not a string.")
        name, literal, value = request.partition("=")
        _check_name(name, position, strict=strict)
        if name in env:
            raise _invalid(f"{name} is requested twice; name each variable once.", name)
        if not literal:
            if name not in host_env:
                raise _invalid(f"{name} is not set on the server; pass {name}=value.", name)
            value = host_env[name]
        _check_value(name, value)
        env[name] = value
    return env


def _check_name(name: str, position: int, *, strict: bool) -> None:
    if len(name) > MAX_NAME_LENGTH or not _NAME.fullmatch(name):
        raise _invalid(
            f"Environment request #{position} does not start with a valid name "
            "(letters, digits and '_', not starting with a digit); use NAME or NAME=value."
        )
    if name.upper().startswith(_ALWAYS_REFUSED_PREFIXES):
        raise JailError(
            "ENV_NAME_REFUSED",
            f"{name} is the server's own configuration and never enters a sandbox.",
            {"name": name},
        )
    if strict and is_credential_shaped(name):
        raise JailError(
            "ENV_NAME_REFUSED",
            f"{name} looks like a credential, and this server does not pass credentials "
            "into sandboxes; use a name that does not look like a secret.",
            {"name": name},
        )


def _check_value(name: str, value: str) -> None:
    if "\x00" in value:
        raise _invalid(f"The value of {name} holds a NUL byte, which no variable can hold.", name)
    if len(value.encode("utf-8", "surrogatepass")) > MAX_VALUE_BYTES:
        raise _invalid(f"The value of {name} is larger than {MAX_VALUE_BYTES} bytes.", name)


def _invalid(message: str, name: str | None = None) -> JailError:
    return JailError("ENV_INVALID", message, {"name": name} if name else {})
