"""Making the replicas running match the catalog: the reconciler, how many replicas a model
wants (its demand, the load, autoscaling), where new ones go, what a node is sent to start
one, replicas spread over several nodes, rolling replicas onto new adapters, and the
reconciler's traces.
"""
