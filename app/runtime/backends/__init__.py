"""The implementations of the SandboxBackend seam (``app.runtime.backend``): ``docker``, the
DockerBackend, the façade that composes the engine (``app.runtime.docker``), commands
(``app.runtime.exec``) and clones (``app.runtime.git``), so it sits above all three.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "docker",
]
