"""The MCP Tasks extension: the extension itself, the tasks in memory, and their mirror in the
database.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "extension",
    "mirror",
    "store",
]
