"""The gateway's state shared from one plane to another: its typed events and their codec, the
one server and one follower of the state protocol, the state they record and apply, and
the two channels it runs over (the gRPC stream from the leader to each standby, the Unix
socket from a control plane to each of its gateway workers).
"""
