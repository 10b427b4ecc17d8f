"""The SandboxBackend on the Docker Engine API: the backend façade, the engine client, hardening,
networks, capacity, the hand-over of warm containers and the engine probe.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "capacity",
    "engine",
    "engine_errors",
    "handover",
    "hardening",
    "network",
    "probe",
    "seccomp",
    "threads",
    "workspace",
]
