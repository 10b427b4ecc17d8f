"""What an experiment leaves behind: test results (the workspace facts its runner is detected
from, the report files, and the readers of the runners' reports), changes summed up,
artifacts and their shelf, comparisons; and map_project's summary of the workspace. It reads
the workspace (``app.experiments.workspace``), which never imports it.
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
