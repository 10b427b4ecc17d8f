"""sandbox-mcp: pool."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "background",
    "errors",
    "expiry",
    "handover",
    "leases",
    "mailer",
    "mount_flags",
    "provision",
    "queue",
    "slots",
    "slots_dir",
    "slots_zfs",
    "spread",
    "state",
    "watchdog",
]
