"""Network "restricted": the forward proxy (Squid) run by the server, its rules, network and
firewall, connection bounds, access log and byte meter.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "acl_helper",
    "bounds",
    "connlimit",
    "log",
    "meter",
    "network",
    "owner",
    "proxy",
    "records",
    "rules",
    "sockets",
    "squid",
    "usage",
]
