"""Training jobs on the control plane: the scheduler (a leader duty that places queued jobs,
follows them and collects their results), the collecting of a finished job's files into
the mirror, and what a job's messages carry.
"""
