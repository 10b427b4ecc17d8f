"""One module per family of tools; each exports a ``register_*`` function the root calls."""
