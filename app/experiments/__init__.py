"""The domain core: experiments, their state machine and their jobs."""
