"""sandbox-mcp: pool."""
