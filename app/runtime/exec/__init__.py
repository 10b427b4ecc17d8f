"""Commands in a running container: docker exec and the in-container executor (its protocol,
sessions and agent), process trees, kills, output streams.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "agent",
    "kill",
    "process_tree",
    "protocol",
    "runner",
    "sessions",
    "stream",
    "throttle",
]
