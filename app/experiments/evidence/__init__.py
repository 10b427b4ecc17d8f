"""What an experiment leaves behind: test results (and the readers of the runners' reports),
changes summed up, artifacts and their shelf, comparisons.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "artifacts",
    "compare",
    "evidence",
    "project",
    "readers",
    "shelf",
    "testing",
]
