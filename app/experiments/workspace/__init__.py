"""An experiment's files: where they live, how a project gets there, reading, writing, searching
and diffing them through the jail, and deleting them off the caller's time.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "changes",
    "diff",
    "dirs",
    "files",
    "patterns",
    "trash",
]
