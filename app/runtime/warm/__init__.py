"""Warm sandboxes: containers started before anyone asks, and their slot claims across processes."""
