"""Work across server processes and after the engine or the slot storage went away: the process
registry, jobs of other processes, recovery, recreated containers, remounted slots.
"""
