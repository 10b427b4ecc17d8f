"""The agent-facing MCP surface."""
