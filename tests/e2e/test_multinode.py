"""Two real agents serving multi-node replicas (vLLM over Ray, SGLang) through the gateway (C5.5).

Each node has one fake card; each replica spans both nodes, one shard on each.
The shards really meet over TCP (:mod:`llmgw.testing.standin_rendezvous`):
the head serves once the other rank has joined. Killing one shard's engine
takes its replica down, and the reconciler places it again.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from llmgw.agent.config import EngineSettings, PythonEngineSettings
from llmgw.agent.shardstates import read_state
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.nvidia_smi_standin import H100_80G, install_fake_nvidia_smi
from llmgw.testing.standin_programs import write_standins

pytestmark = pytest.mark.e2e

PROFILES = {
    "mn-vllm": {"engine": "vllm", "tp": 1, "pp": 2, "nodes": 2, "ctx_size": 2048, "parallel": 2},
    "mn-sglang": {"engine": "sglang", "tp": 2, "nodes": 2, "ctx_size": 2048, "parallel": 2},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("multinode")
    programs = write_standins(home / "standins")
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        blob = running.upload(filename="config.json", data=b'{"architectures": ["LlamaForCausalLM"]}')
        source = {"sha256": blob["sha256"], "filename": "config.json", "format": "safetensors"}
        for name, profile in PROFILES.items():
            running.admin.request("POST", "/api/models", {"name": name, "source": source, "profile": profile})
        running.create_key("tests")
        for node_id, first in (("a", 21000), ("b", 21500)):
            running.add_node(
                node_id,
                # two agents on one machine: engines bind their ports late (once every rank is in),
                # so each node takes its ports from a range of its own, as separate machines would
                ports={"first": first, "last": first + 499},
                nvidia_smi=str(install_fake_nvidia_smi(home / f"smi-{node_id}", [H100_80G])),
                engines=EngineSettings(
                    vllm=PythonEngineSettings(program=str(programs.vllm)),
                    sglang=PythonEngineSettings(program=str(programs.python)),
                ),
            )
            running.start_agent(node_id)
        yield running


def ask(cluster: Cluster, model: str) -> str:
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=30)
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    )
    return str(answer.choices[0].message.content)


def shards(cluster: Cluster, model: str) -> list[dict[str, Any]]:
    return sorted(cluster.replicas(model), key=lambda r: r["id"])


def serving(cluster: Cluster, model: str, not_id: str = "") -> list[dict[str, Any]] | None:
    """The model's two shards once both are ready (and the head is not ``not_id``), else None."""
    found = shards(cluster, model)
    if len(found) == 2 and all(r["state"] == "ready" for r in found) and found[0]["id"] != not_id:
        return found
    return None


def engine_pid(cluster: Cluster, replica_id: str) -> int:
    for directory in cluster.home.glob(f"nodes/*/work/shards/{replica_id}"):
        return read_state(directory).pid
    raise LookupError(f"no shard directory for {replica_id}")


@pytest.mark.parametrize("model", sorted(PROFILES))
def test_a_two_node_replica_serves_through_its_head_and_comes_back_after_a_shard_is_killed(
    cluster: Cluster, model: str
) -> None:
    try:
        head, member = wait_for(lambda: serving(cluster, model), 120, f"both shards of {model} ready")
        assert member["id"] == f"{head['id']}.r1" and head["node"] != member["node"]
        assert ask(cluster, model) == " tok0 tok1 tok2"
        os.kill(engine_pid(cluster, member["id"]), signal.SIGKILL)  # rank 1's engine dies
        again = wait_for(lambda: serving(cluster, model, not_id=head["id"]), 120, f"{model} placed again")
    except AssertionError as error:
        raise AssertionError(f"{error}\n--- logs ---\n{cluster.tails(40)}") from None
    assert again[0]["id"] != head["id"]
    assert ask(cluster, model) == " tok0 tok1 tok2"
