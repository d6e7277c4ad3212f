"""What the control plane's ``/metrics`` serves: the cluster's state (nodes, replicas,
leadership, reconcile passes, the store) and, behind gateway workers, their gateway
samples added.
"""
