"""Every bound on one sandbox or one sign-in address: worker threads, calls in flight, concurrent
jobs.
"""
