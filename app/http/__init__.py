"""The HTTP endpoints beside ``/mcp``: health, metrics, and the security headers."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "connection_guard",
    "graceful",
    "health",
    "hsts",
    "metrics",
]
