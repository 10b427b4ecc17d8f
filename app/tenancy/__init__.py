"""Every bound on one sandbox or one sign-in address: worker threads, calls in flight, concurrent
jobs.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "calls_in_flight",
    "job_limits",
    "threads",
]
