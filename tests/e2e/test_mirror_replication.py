"""A replicated mirror on two control planes (PostgreSQL store): an import on cp1 is pulled by cp2, and
after cp1 dies (kill -9) a new model on that blob starts on a node from cp2 and answers."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import write_launcher
from llmgw.testing.postgres import postgres

pytestmark = pytest.mark.e2e

LEASE_S = 4.0
WEIGHTS = bytes(range(256)) * (12 * 1024)  # 3 MiB: a pull of several chunks


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """cp1 leading and cp2 standing by on PostgreSQL; node1 with the stand-in llama-server, registered."""
    home = tmp_path_factory.mktemp("mirror")
    with postgres() as database:
        with Cluster(home / "cluster", home / "cache", store_url=database.url, lease_s=LEASE_S) as cluster:
            cluster.start_leader_and_standby(20)
            wait_for(lambda: cluster.admin.get("/api/status")["standbys"] == ["cp2"], 20, "cp1 sees cp2")
            launcher = write_launcher(home / "bin" / "llama-server")
            cluster.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
            cluster.start_agent("node1")
            wait_for(lambda: cluster.admin.get("/api/nodes"), 30, "node1 registers")
            yield cluster


def copies(cluster: Cluster, name: str, sha256: str) -> list[str]:
    blobs = cluster.admin_of(name).get("/api/mirror/blobs")
    return [c["plane"] for b in blobs if b["sha256"] == sha256 for c in b["copies"]]


def test_an_import_answers_once_both_planes_hold_it_and_cp2_serves_it_after_cp1_dies(
    ha: Cluster, tmp_path: Path
) -> None:
    imported: dict[str, Any] = ha.upload(filename="standin.gguf", data=WEIGHTS)
    sha = imported["sha256"]
    assert (sorted(imported["copies"]), imported["wanted"]) == (["cp1", "cp2"], 2), imported
    assert sorted(copies(ha, "cp2", sha)) == ["cp1", "cp2"]
    pulled = ha.home / "cp2" / "mirror" / "sha256" / sha[:2] / sha
    assert pulled.read_bytes() == WEIGHTS

    ha.kill("server", signal.SIGKILL)
    wait_for(lambda: ha.leader() == "cp2", 30, "cp2 leads after cp1 was killed")
    cp2 = ha.admin_of("cp2")
    cp2.request(
        "POST", "/api/models", {"name": "replicated", "source": {"sha256": sha, "filename": "m.gguf"}}
    )
    key = cp2.request("POST", "/api/keys", {"name": "tests"})["key"]

    def ready() -> bool:
        return any(r["model"] == "replicated" and r["state"] == "ready" for r in cp2.get("/api/replicas"))

    try:
        wait_for(ready, 90, "a replica of the new model is ready on node1, its weights from cp2")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{ha.tails()}") from None
    client = openai.OpenAI(base_url=f"{ha.url_of('cp2')}/v1", api_key=key, max_retries=0, timeout=30)
    answer = client.chat.completions.create(model="replicated", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content
    fetched = ha.home / "nodes" / "node1" / "work" / "weights" / sha / "m.gguf"
    assert fetched.read_bytes() == WEIGHTS
