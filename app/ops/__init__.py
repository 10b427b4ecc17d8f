"""The operator's commands and the serving process's own upkeep: check and provision, the workers
supervisor, the base images, the state dir and its lock.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "admin",
    "base_images",
    "workers",
]
