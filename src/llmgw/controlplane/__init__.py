"""The control plane: leads the cluster, serves the HTTP port, and keeps the nodes' replicas
matching the catalog.

``config.py`` reads server.yaml, ``wiring.py`` builds the parts and ``running.py`` runs the process;
``api/`` holds the admin API's routers. Each subpackage holds one concept (its ``__init__.py``
says which); none re-exports anything: import a module by its full path.
"""
