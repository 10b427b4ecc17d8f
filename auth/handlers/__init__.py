"""One module per endpoint; each handler is a dataclass of its dependencies with ``handle``."""
