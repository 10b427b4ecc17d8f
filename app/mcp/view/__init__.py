"""The MCP Apps view (``io.modelcontextprotocol/ui``): the sandbox at a glance, inline in
a client that renders Apps (claude.ai).

- ``resource.py``: the ``ui://`` resource (one self-contained HTML page, ``page.html``),
  its CSP and claude.ai's ``domain``, and the ``_meta`` the tools that name it carry.
- ``tools.py``: the app-only tools (``visibility: ["app"]``) the view fetches its data
  with, through the same runner as every tool (the caller's own sandbox only).
- ``snapshot.py``: what those tools return, each bounded well under what a host hands
  a view whole.
- ``gate.py``: the view offered only to requests whose client declares the extension,
  and only while ``SANDBOX_MCP_APPS_VIEW`` is on; everyone else sees the server as if
  the view did not exist.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "gate",
    "resource",
    "snapshot",
    "tools",
]
