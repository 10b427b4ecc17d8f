"""An experiment's files: where they live, how a project gets there, reading, writing, searching
and diffing them through the jail, and deleting them off the caller's time.
"""
