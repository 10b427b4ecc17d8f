"""Concurrent jobs per sandbox and per experiment: one tenant's jobs stay within its share.

A job's output is read by a worker thread while it runs (see
``app.runtime.docker.capacity``): capping every sandbox's concurrent jobs is what lets
the server size those readers so that another tenant's output is always read.
Setup commands are not counted here: they run one at a time inside a creation,
and creations are bounded by the experiments cap.

Claims are taken synchronously (no ``await`` between the check and the count),
so many calls at once cannot all slip under the cap.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from app.errors import ConfigurationError, LimitReached


class JobLimits:
    def __init__(self, per_sandbox: int, per_experiment: int) -> None:
        if per_sandbox < 1 or per_experiment < 1:
            raise ConfigurationError("The concurrent-job limits must be at least 1.")
        self.per_sandbox = per_sandbox
        self.per_experiment = per_experiment
        self._sandboxes: Counter[str] = Counter()
        self._experiments: Counter[str] = Counter()

    def claim(self, sandbox_key: str, experiment_id: str) -> Callable[[], None]:
        """Count one more job, or refuse it; returns the release (safe to call twice).

        Raises:
            LimitReached: the experiment or the sandbox already runs its maximum.
        """
        if self._experiments[experiment_id] >= self.per_experiment:
            raise LimitReached(
                f"This experiment already runs its maximum of {self.per_experiment} jobs at "
                "once; wait for one to end (get_job_result) or cancel one (cancel_job).",
                limit="jobs_per_experiment",
                value=self.per_experiment,
            )
        if self._sandboxes[sandbox_key] >= self.per_sandbox:
            raise LimitReached(
                f"Your sandbox already runs its maximum of {self.per_sandbox} jobs at once "
                "across its experiments; wait for one to end (get_job_result) or cancel one "
                "(cancel_job).",
                limit="jobs_per_sandbox",
                value=self.per_sandbox,
            )
        self._experiments[experiment_id] += 1
        self._sandboxes[sandbox_key] += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            for counter, key in (
                (self._experiments, experiment_id),
                (self._sandboxes, sandbox_key),
            ):
                counter[key] -= 1
                if counter[key] <= 0:
                    del counter[key]

        return release
