"""The HTTP endpoints beside ``/mcp``: health, metrics, and the security headers."""
