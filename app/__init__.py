"""sandbox-mcp: app."""
