"""sandbox-mcp: app."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "cli",
    "egress",
    "errors",
    "experiments",
    "http",
    "mcp",
    "observability",
    "ops",
    "root",
    "runtime",
    "sampling",
    "settings",
    "storage",
    "tenancy",
    "version",
]
