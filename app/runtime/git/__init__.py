"""Git sources: which may be cloned, which network a clone joins and where it may connect, and
the clone helper container.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "clone",
    "egress",
    "network",
    "sources",
]
