"""The MCP Tasks extension: the extension itself, the tasks in memory, and their mirror in the
database.
"""
