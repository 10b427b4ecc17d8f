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
    code = "INVALID_STATE"


class TooManyExperiments(ServiceError):
    code = "TOO_MANY_EXPERIMENTS"


class ModeRefused(ServiceError):
    code = "NOT_ALLOWED_HERE"


class ProjectSourceError(ServiceError):
    code = "INVALID_PROJECT"


class EditNotFound(ServiceError):
    code = "EDIT_NOT_FOUND"


class EditNotUnique(ServiceError):
    code = "EDIT_NOT_UNIQUE"


class TestsNotDetected(ServiceError):
    __test__ = False
    code = "TESTS_NOT_DETECTED"
