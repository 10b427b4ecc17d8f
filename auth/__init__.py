"""sandbox-mcp: auth."""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "admission",
    "bearer",
    "client_address",
    "client_documents",
    "clients",
    "config",
    "errors",
    "grants",
    "handlers",
    "page",
    "pending",
    "pkce",
    "ratelimit",
    "redirects",
    "registration",
    "routes",
    "safe_fetch",
    "sealing",
    "signin",
    "store",
    "tokens",
]
