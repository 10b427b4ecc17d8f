"""The composition root: the only place that reads settings and builds storage's classes; it wires
every part (build_app, build_services) and the assemblies of the runtime, the experiments, the
tool layer and the OAuth server.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "experiments",
    "main",
    "mcp",
    "oauth",
    "runtime",
    "services",
    "shared_limits",
    "slot_storage",
    "state_dir",
    "state_lock",
]
