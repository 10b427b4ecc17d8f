"""Errors of the container runtime, with stable codes.

    ServiceError (app.errors)
     └── RuntimeFailure            catch this for any runtime failure
          ├── ImageNotAllowed      IMAGE_NOT_ALLOWED
          ├── ImageMissing         IMAGE_MISSING
          ├── WorkspaceRefused     WORKSPACE_REFUSED
          ├── CapacityExceeded     CAPACITY_EXCEEDED
          ├── EgressDisabled       EGRESS_DISABLED
          ├── GitSourceRefused     GIT_SOURCE_REFUSED
          ├── GitEgressDisabled    GIT_EGRESS_DISABLED
          ├── ContainerGone        CONTAINER_GONE
          ├── ExecutorStopped      EXECUTOR_STOPPED
          └── RuntimeUnavailable   RUNTIME_UNAVAILABLE

Docker SDK and ``requests`` errors are translated inside the backend with
``raise ... from exc``, so the original stays in ``__cause__`` for the logs.
Messages say what to do next and never hold a host path: agents read them.
"""

from __future__ import annotations

from typing import Literal

from app.errors import ServiceError

RuntimeFailureCode = Literal[
    "IMAGE_NOT_ALLOWED",
    "IMAGE_MISSING",
    "WORKSPACE_REFUSED",
    "CAPACITY_EXCEEDED",
    "EGRESS_DISABLED",
    "GIT_SOURCE_REFUSED",
    "GIT_EGRESS_DISABLED",
    "CONTAINER_GONE",
    "EXECUTOR_STOPPED",
    "RUNTIME_UNAVAILABLE",
]


class RuntimeFailure(ServiceError):
    """Base of every error raised by a :class:`~app.runtime.backend.SandboxBackend`."""

    code: str = "RUNTIME_FAILURE"


class ImageNotAllowed(RuntimeFailure):
    code = "IMAGE_NOT_ALLOWED"

    def __init__(self, image: str, allowed: tuple[str, ...]) -> None:
        super().__init__(
            f"The image {image!r} is not allowed on this server; use one of: {', '.join(allowed)}.",
            image=image,
            allowed=list(allowed),
        )


class ImageMissing(RuntimeFailure):
    code = "IMAGE_MISSING"

    def __init__(self, image: str) -> None:
        super().__init__(
            f"The image {image!r} is allowed but not built on this server; pick another "
            "image, or ask the operator to run deploy/build-base-image.",
            image=image,
        )


class WorkspaceRefused(RuntimeFailure):
    code = "WORKSPACE_REFUSED"

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"The experiment's workspace folder was refused ({reason}); it must be a real "
            "folder (no symbolic links) inside the sandbox's own slot.",
            reason=reason,
        )


class CapacityExceeded(RuntimeFailure):
    code = "CAPACITY_EXCEEDED"

    def __init__(self, limit: int, *, spare: int | None = None) -> None:
        if spare is None:
            super().__init__(
                f"The server already runs its maximum of {limit} experiment containers; "
                "destroy an experiment you no longer need, or try again in a few minutes.",
                limit=limit,
                reason="server_full",
            )
            return
        # A second or later container: the share every sandbox's first one leaves.
        super().__init__(
            f"Your sandbox already has an experiment, and the {spare} containers this server "
            "keeps for second and later experiments (beyond one for every sandbox slot) are "
            "in use; keep working in the experiment you have, destroy one you no longer "
            "need, or try again in a few minutes.",
            limit=limit,
            spare=spare,
            reason="spare_in_use",
        )


class EgressDisabled(RuntimeFailure):
    code = "EGRESS_DISABLED"

    def __init__(self) -> None:
        super().__init__(
            "Network egress is disabled on this server; create the experiment with "
            "network 'none' (the default) and bring dependencies in through its files."
        )


class RestrictedUnavailable(RuntimeFailure):
    code = "EGRESS_DISABLED"

    def __init__(self) -> None:
        super().__init__(
            "Network 'restricted' (egress to allow-listed package registries through a "
            "proxy) is not offered on this server; use network 'none' and bring "
            "dependencies in through the files, or ask the operator to set "
            "SANDBOX_MCP_EGRESS_PROXY."
        )


GitSourceField = Literal["url", "ref", "local_path"]

_GIT_HINTS: dict[str, str] = {
    "url": "give an https:// URL without credentials, such as https://host/owner/repo.git",
    "ref": "give a branch, a tag or a commit, such as main, v1.2.0 or a commit hash",
    "local_path": "give a git repository folder on this server, outside the sandboxes' storage",
}


class GitSourceRefused(RuntimeFailure):
    code = "GIT_SOURCE_REFUSED"

    def __init__(self, field: GitSourceField, reason: str) -> None:
        # Never echoes the URL or the path: either may hold a secret or a host path.
        super().__init__(
            f"The git {field.replace('_', ' ')} was refused ({reason}); {_GIT_HINTS[field]}.",
            field=field,
            reason=reason,
        )


class GitEgressDisabled(RuntimeFailure):
    code = "GIT_EGRESS_DISABLED"

    def __init__(self) -> None:
        super().__init__(
            "Cloning from the network is disabled on this server; send the project's files "
            "instead, or ask the operator to allow git egress."
        )


class ContainerGone(RuntimeFailure):
    code = "CONTAINER_GONE"

    def __init__(self, container_id: str) -> None:
        super().__init__(
            "The experiment's container has stopped or no longer exists (the Docker engine "
            "may have restarted); a stopped container is started again within seconds once "
            "the engine is back, so retry shortly; if it keeps failing, destroy the "
            "experiment and create it again.",
            container_id=container_id[:12],
        )


class ExecutorStopped(RuntimeFailure):
    """The container's command executor (app.runtime.exec.protocol) went away under a
    command; ``why`` is one of that module's stable reasons."""

    code = "EXECUTOR_STOPPED"

    def __init__(self, why: str) -> None:
        super().__init__(
            f"The sandbox's command executor stopped under the command: {why}. The "
            "command's process tree was killed and its result is lost; the sandbox's "
            "commands go on through docker exec (slower, otherwise the same): run it again.",
            reason=why,
        )


class RuntimeUnavailable(RuntimeFailure):
    code = "RUNTIME_UNAVAILABLE"

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"The container runtime is unavailable ({reason}); try again shortly, and if it "
            "persists ask the operator to check the Docker engine.",
            reason=reason,
        )
