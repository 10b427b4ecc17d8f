"""What an experiment leaves behind: test results (and the readers of the runners' reports),
changes summed up, artifacts and their shelf, comparisons.
"""
