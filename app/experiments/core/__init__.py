"""The bottom layer of experiments, shared by its parts (workspace, evidence, recovery) and by
the lifecycle above them: the records and their states, the errors, results, the
ExperimentStore Protocol the records are kept behind, and the jobs running in this process.
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "errors",
    "jobs",
    "records",
    "result",
    "states",
    "store",
]
