"""Errors of the experiment domain, each with a stable code and a sentence to act on."""

from __future__ import annotations

from app.errors import ServiceError


class ExperimentNotFound(ServiceError):
    code = "NOT_FOUND"

    def __init__(self, kind: str, identifier: str) -> None:
        # The same answer for another sandbox's id and an id that never existed.
        super().__init__(
            f"No {kind} {identifier!r} exists in your sandbox; list_experiments shows yours.",
            id=identifier,
        )


class InvalidTransition(ServiceError):
    """The experiment is not in a state this call works in: destroyed, still being
    created, or (the state machine of app.experiments.core.states) not allowed to move to
    the state the call would put it in."""

    code = "INVALID_STATE"


class TooManyExperiments(ServiceError):
    """The sandbox already holds its most live experiments (destroy one first)."""

    code = "TOO_MANY_EXPERIMENTS"


class ModeRefused(ServiceError):
    code = "NOT_ALLOWED_HERE"  # a local-mode-only source (project_path) on a hosted server


class ProjectSourceError(ServiceError):
    """A request about the project or its workspace that cannot be served: a source, a
    path, a pattern or content that is malformed, too big or of the wrong kind (the
    message says which)."""

    code = "INVALID_PROJECT"


class EditNotFound(ServiceError):
    code = "EDIT_NOT_FOUND"  # edit_sandbox_file: old_text is not in the file


class EditNotUnique(ServiceError):
    code = "EDIT_NOT_UNIQUE"  # edit_sandbox_file: old_text occurs more than once


class TestsNotDetected(ServiceError):
    """run_tests found no test runner it knows in the workspace (pass `command`)."""

    __test__ = False  # not a test class, whatever pytest thinks of its name
    code = "TESTS_NOT_DETECTED"


class ArtifactTooLarge(ServiceError):
    """An artifact larger than one read returns, or a part past its end."""

    code = "ARTIFACT_TOO_LARGE"
