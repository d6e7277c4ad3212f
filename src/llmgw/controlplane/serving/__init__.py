"""Serving the HTTP port: the uvicorn server, the gateway built from ``server.yaml`` (one
builder for the control plane and its workers), a standby relaying ``/api`` and ``/v1`` to
the leader and the leader answering them in process, and the gateway worker processes
(started, restarted and stopped by their control plane, each serving ``/v1`` itself).
"""
