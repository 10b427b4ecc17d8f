"""Work across server processes and after the engine or the slot storage went away: the process
registry, jobs of other processes, recovery, recreated containers, remounted slots.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "process_registry",
    "recovery",
    "recreation",
    "remote_jobs",
    "slot_mounts",
]
