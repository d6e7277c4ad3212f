"""Two control planes on PostgreSQL serving a stand-in model, with a project whose key is limited."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from llmgw.client.admin import AdminClient
from llmgw.core.limits import Limits
from llmgw.testing.cluster import Cluster
from llmgw.testing.llama_server_standin import write_launcher
from llmgw.testing.postgres import PostgresServer

MODEL = "standin-chat"
PROJECT = "project:acme/ml/chat"


@dataclass
class LimitedProject:
    cluster: Cluster
    database_url: str
    key: str
    """The secret of a key placed in :data:`PROJECT`."""
    admin: AdminClient
    """The admin API the project was made through."""


@contextmanager
def limited_project(
    home: Path, limits: Limits, *, lease_s: float, via: str, ready_s: float
) -> Iterator[LimitedProject]:
    """cp1 leading and cp2 standing by on a throwaway PostgreSQL; organisation acme, team ml and
    project chat made through ``via``'s admin API with ``limits`` and a key; node1 serving
    :data:`MODEL` with the llama-server stand-in."""
    with PostgresServer.start() as database:
        with Cluster(home / "cluster", home / "cache", store_url=database.url, lease_s=lease_s) as cluster:
            cluster.start_leader_and_standby(20)
            cluster.add_standin_model(MODEL)
            admin = cluster.admin_of(via)
            for path, body in (
                ("/api/orgs", {"name": "acme"}),
                ("/api/teams", {"org": "acme", "name": "ml"}),
                ("/api/projects", {"org": "acme", "team": "ml", "name": "chat"}),
            ):
                admin.request("POST", path, body)
            key = str(admin.request("POST", "/api/keys", {"name": "limited", "place": PROJECT})["key"])
            admin.request("PUT", f"/api/limits/{PROJECT}", limits.as_dict())
            launcher = write_launcher(home / "bin" / "llama-server")
            cluster.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
            cluster.start_agent("node1")
            cluster.wait_ready(MODEL, ready_s)
            yield LimitedProject(cluster, database.url, key, admin)
