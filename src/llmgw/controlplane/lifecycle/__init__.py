"""Who leads and how the processes start again: the leader lease, the duties started and
stopped with it, a control plane re-executing itself, ``llmgw restart`` taking the cluster
one process at a time, and agents rolled onto a signed release one node at a time.
"""
