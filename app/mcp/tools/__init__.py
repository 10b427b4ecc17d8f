"""One module per family of tools, each tool a module-level function over ``ToolDeps``;
``catalog`` lists them all and registers them (the root calls ``catalog.register``)."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "catalog",
    "common",  # what the tools share (the view's app-only tools too)
    "evidence",
    "experiments",
    "files",
    "jobs",
    "seed_names",
    "status",
]
