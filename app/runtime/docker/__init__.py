"""The SandboxBackend on the Docker Engine API: the backend façade, the engine client, hardening,
networks, capacity, the hand-over of warm containers and the engine probe.
"""
