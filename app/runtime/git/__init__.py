"""Git sources: which may be cloned, where a clone may connect, and the clone helper container."""
