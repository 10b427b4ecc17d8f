"""The domain: experiments, their state machine and their jobs, in three layers (each imports
only those below it): the lifecycle here (manager, creation, execution, commands, views,
options and the budgets); its parts ``workspace``, then ``evidence`` and ``recovery``; and
``core`` (records, states, errors, results, the ExperimentStore Protocol, running jobs).
"""

# The package's surface: its public modules (imported by name, never re-exported here).
__all__ = [
    "commands",
    "core",
    "creation",
    "disk_budget",
    "evidence",
    "execution",
    "held_files",
    "manager",
    "options",
    "output_budget",
    "recovery",
    "views",
    "workspace",
]
