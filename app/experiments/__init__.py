"""The domain core: experiments, their state machine and their jobs."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "commands",
    "core",
    "creation",
    "disk_budget",
    "evidence",
    "execution",
    "held_files",
    "manager",
    "options",
    "recovery",
    "views",
    "workspace",
]
