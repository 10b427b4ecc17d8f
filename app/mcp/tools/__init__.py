"""One module per family of tools; each exports a ``register_*`` function the root calls."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "common",  # what the tools share (the view's app-only tools too)
    "evidence",
    "experiments",
    "files",
    "jobs",
    "seed_names",
    "status",
]
