"""The agent-facing surface: the MCP server, the tool runner, the result envelope, the tools
and the resources. Nothing of the domain lives here: tools translate arguments into domain
calls and domain records into results."""
