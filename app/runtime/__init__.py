"""Containers: the SandboxBackend seam and its Docker implementation."""
