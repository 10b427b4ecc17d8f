"""The domain core: experiments, their state machine and their jobs."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "commands",
    "creation",
    "disk_budget",
    "errors",
    "evidence",
    "execution",
    "held_files",
    "jobs",
    "manager",
    "options",
    "records",
    "recovery",
    "result",
    "states",
    "store",
    "views",
    "workspace",
]
