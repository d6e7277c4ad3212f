"""The admin side of the HTTP port: the ``/api`` app over the routers of ``controlplane/api/``,
who calls it (the admin token and users' tokens, known in memory), what a request must bring
before its body is read (admission), and the publisher of what changed behind
``GET /api/events``.
"""
