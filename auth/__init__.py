"""sandbox-mcp: auth."""
