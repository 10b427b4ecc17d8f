"""The Docker Engine API layer that the backend (``app.runtime.backends.docker``), commands
(``exec``) and clones (``git``) build on: the engine client and its errors, the offload
threads, hardening, the experiments' networks, capacity, the creation gate, the hand-over of
warm containers and the engine probe.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "capacity",
    "creates",
    "engine",
    "engine_errors",
    "handover",
    "hardening",
    "listing",
    "network",
    "probe",
    "seccomp",
    "threads",
    "workspace",
]
