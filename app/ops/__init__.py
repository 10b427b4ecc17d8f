"""The operator's commands and the serving process's own upkeep: check and provision, the workers
supervisor, the base images, the state dir and its lock.
"""
