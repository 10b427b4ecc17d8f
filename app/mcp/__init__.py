"""The agent-facing surface: the MCP server, the tool runner, the result envelope, the tools
and the resources. Nothing of the domain lives here: tools translate arguments into domain
calls and domain records into results."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "allowed_hosts",
    "call_sampling",
    "envelope",
    "fit",
    "listen_streams",
    "request_bounds",
    "resources",
    "runner",
    "schemas",
    "server",
    "status_view",
    "tasks",
    "tools",
    "transport",
    "view",
]
