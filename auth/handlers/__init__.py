"""One module per endpoint; each handler is a dataclass of its dependencies with ``handle``."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "authorize",
    "metadata",
    "register",
    "revoke",
    "token",
]
