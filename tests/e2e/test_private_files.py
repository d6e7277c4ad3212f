"""After a cluster ran, nothing under the server's home that holds a secret is readable by others, and
the store's files hold no engine key in plain text."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmgw.agent.shardstates import read_state
from llmgw.testing.cluster import Cluster
from llmgw.testing.llama_server_standin import write_launcher

pytestmark = pytest.mark.e2e

MODEL = "private-chat"

OWNER_ONLY = ("server.yaml", "admin.token", "ca.key", "server.key", "store-secrets.key", "up.key")
"""Files of the server's home that are secrets by name, whatever they hold."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("private")
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        running.add_standin_model(MODEL)
        running.create_key()
        launcher = write_launcher(home / "bin" / "llama-server")
        running.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
        running.start_agent("node1")
        running.wait_ready(MODEL, 60)
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key=running.key, max_retries=0, timeout=30)
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        yield running


def engine_keys(cluster: Cluster) -> list[str]:
    """Every replica's engine key, from its shard's state on its node."""
    return [read_state(shard).spec.api_key for shard in cluster.home.glob("nodes/*/work/shards/*")]


def files(home: Path) -> list[Path]:
    return [path for path in home.rglob("*") if path.is_file() and not path.is_symlink()]


def readable_by_others(path: Path) -> bool:
    return bool(stat.S_IMODE(path.stat().st_mode) & 0o077)


def test_no_file_holding_a_secret_is_readable_by_others(cluster: Cluster) -> None:
    keys = engine_keys(cluster)
    assert keys and all(keys)
    secrets = [s.encode() for s in (*keys, cluster.token, cluster.key)]
    exposed = []
    for path in files(cluster.home):
        data = path.read_bytes()
        holds = (
            path.name in OWNER_ONLY
            or path.name.startswith("llmgw.db")
            or b"PRIVATE KEY" in data
            or any(secret in data for secret in secrets)
        )
        if holds and readable_by_others(path):
            exposed.append(f"{path.relative_to(cluster.home)} ({stat.S_IMODE(path.stat().st_mode):o})")
    assert exposed == []
    assert (cluster.home / "store-secrets.key").exists() and (cluster.home / "llmgw.db").exists()


def test_the_store_holds_no_engine_key_in_plain_text(cluster: Cluster) -> None:
    keys = [key.encode() for key in engine_keys(cluster)]
    store_files = [p for p in cluster.home.iterdir() if p.name.startswith("llmgw.db")]
    assert store_files
    found = [p.name for p in store_files for key in keys if key in p.read_bytes()]
    assert found == []
    assert any(b"enc1:" in p.read_bytes() for p in store_files)  # the keys are there, sealed
