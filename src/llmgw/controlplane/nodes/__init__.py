"""The nodes and what they tell the leader: the fleet (observed state, in memory), each node's
stream (registration, shard status, heartbeats), registrations recorded in the store,
settings sent to each node, logs read through its stream, each card's recent readings,
and the firewall part computed from the nodes and control planes.
"""
