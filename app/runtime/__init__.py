"""Containers: the SandboxBackend seam and its Docker implementation.

The seam is what the rest of the service uses: the Protocol and its records
(``backend``), the errors with their stable codes (``errors``) and the clamps to
the operator's ceilings (``limits``), all exported here. The Docker implementation
lives in the subpackages and is built by the composition root only: ``backends``
(DockerBackend, the façade) over ``docker`` (the engine), ``exec`` (commands) and ``git``
(clones); ``warm`` holds containers started ahead.
"""

from app.runtime.backend import (
    Container,
    ContainerSpec,
    ExecResult,
    GitSource,
    Isolation,
    Limits,
    NetworkMode,
    Revival,
    RuntimeInfo,
    SandboxBackend,
)
from app.runtime.errors import (
    CapacityExceeded,
    ContainerGone,
    EgressDisabled,
    ExecutorStopped,
    GitEgressDisabled,
    GitSourceRefused,
    ImageMissing,
    ImageNotAllowed,
    RestrictedUnavailable,
    RuntimeFailure,
    RuntimeUnavailable,
    WorkspaceRefused,
)
from app.runtime.limits import FLOORS, Ceilings, clamp_limits, clamp_timeout

__all__ = [
    "FLOORS",
    "CapacityExceeded",
    "Ceilings",
    "Container",
    "ContainerGone",
    "ContainerSpec",
    "EgressDisabled",
    "ExecResult",
    "ExecutorStopped",
    "GitEgressDisabled",
    "GitSource",
    "GitSourceRefused",
    "ImageMissing",
    "ImageNotAllowed",
    "Isolation",
    "Limits",
    "NetworkMode",
    "RestrictedUnavailable",
    "Revival",
    "RuntimeFailure",
    "RuntimeInfo",
    "RuntimeUnavailable",
    "SandboxBackend",
    "WorkspaceRefused",
    "clamp_limits",
    "clamp_timeout",
]
