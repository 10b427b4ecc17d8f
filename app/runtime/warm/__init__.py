"""Warm sandboxes: containers started before anyone asks, and their slot claims across processes."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "claims",
    "demand",
    "folders",
    "pool",
    "prepared",
]
