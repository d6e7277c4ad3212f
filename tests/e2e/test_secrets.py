"""Replica keys stay secret, and the mirror serves a node only its own replicas' files.

A real control plane and agent run a real llama-server (SmolLM2) and the vLLM
and SGLang stand-ins, which take the key the way the real engines do (a key
file, ``VLLM_API_KEY``, SGLang's ``--config``) and print at start what the
real ones print (SGLang logs its arguments, the key among them). With every
replica ready and answering, each replica's key (read from its shard's 0600
state file) must appear:

- in no process's command line (``/proc/*/cmdline``, which every user reads);
- in no process's environment (``/proc/*/environ``, which only the process's
  own user and root read) except that of the engine that takes it from
  there by design (vLLM's, in its shard's directory);
- in no engine output file, in none of the lines the logs API serves, and in
  neither the agent's nor the control plane's log;

and only in the key file of an engine that reads one (0600), besides the
state file.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmgw.agent.config import EngineSettings, PythonEngineSettings
from llmgw.agent.shardstates import read_state
from llmgw.cli.up import DEFAULT_MODEL
from llmgw.core.engines import KeyPassing, engine_capabilities
from llmgw.errors import Unauthorized
from llmgw.protocol.grpc_client import GrpcConnector
from llmgw.protocol.grpc_transport import TlsFiles
from llmgw.testing.cluster import Cluster
from llmgw.testing.standin_programs import write_standins

pytestmark = pytest.mark.e2e

STANDINS = {"std-vllm": "vllm", "std-sglang": "sglang"}


@pytest.fixture(scope="module")
def secrets_cluster(
    tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path
) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("secrets")
    programs = write_standins(home / "standins")
    with Cluster(home / "cluster", engine_cache) as running:
        running.start_server()
        running.add_model(DEFAULT_MODEL, model_file, {"ctx_size": 2048, "parallel": 1})
        config = running.upload(filename="config.json", data=b'{"architectures": ["LlamaForCausalLM"]}')
        for name, engine in STANDINS.items():
            source = {"sha256": config["sha256"], "filename": "config.json", "format": "safetensors"}
            running.admin.request(
                "POST", "/api/models", {"name": name, "source": source, "profile": {"engine": engine}}
            )
        running.create_key()
        running.add_node(
            "node1",
            engines=EngineSettings(
                vllm=PythonEngineSettings(program=str(programs.vllm)),
                sglang=PythonEngineSettings(program=str(programs.python)),
            ),
        )
        running.start_agent("node1")
        for name in (DEFAULT_MODEL, *STANDINS):
            running.wait_ready(name, 180)
        yield running


def shards(cluster: Cluster) -> dict[str, Path]:
    """Each replica's shard directory on the node, by replica id."""
    return {path.name: path for path in (cluster.home / "nodes" / "node1" / "work" / "shards").iterdir()}


def keys(cluster: Cluster) -> dict[str, str]:
    """Each replica's key, by replica id, from its shard's state file (0600, the agent's)."""
    return {replica: read_state(path).spec.api_key for replica, path in shards(cluster).items()}


def processes() -> Iterator[tuple[int, Path]]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry), Path("/proc") / entry


def holding(text: bytes, found: dict[str, str]) -> list[str]:
    """The replicas whose key is in ``text``."""
    return [replica for replica, key in found.items() if key.encode() in text]


def test_every_replica_answers_with_its_key_off_every_command_line(secrets_cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=f"{secrets_cluster.url}/v1", api_key=secrets_cluster.key, max_retries=0)
    for model in (DEFAULT_MODEL, *STANDINS):
        answer = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=3
        )
        assert answer.choices[0].message.role == "assistant"
    found = keys(secrets_cluster)
    assert len(found) == 3 and all(found.values())

    seen = []
    for pid, proc in processes():
        try:
            command = (proc / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        seen.append(pid)
        assert not holding(command, found), f"a key on the command line of pid {pid}: {command!r}"
    assert len(seen) > 3


def test_a_key_is_in_no_environment_but_that_of_the_engine_reading_it_from_there(
    secrets_cluster: Cluster,
) -> None:
    found = keys(secrets_cluster)
    directories = shards(secrets_cluster)
    engines = {replica: read_state(path).spec.engine for replica, path in directories.items()}
    holders: dict[str, list[int]] = {}
    for pid, proc in processes():
        try:
            environment, cwd = (proc / "environ").read_bytes(), (proc / "cwd").resolve()
        except OSError:
            continue  # another user's process (only its user and root read it), or ended
        for replica in holding(environment, found):
            assert engine_capabilities(engines[replica]).key_input.passing is KeyPassing.ENV, (
                f"the key of {replica} ({engines[replica]}) is in the environment of pid {pid}"
            )
            assert cwd == directories[replica].resolve(), (
                f"pid {pid} holds {replica}'s key but is not its engine"
            )
            holders.setdefault(replica, []).append(pid)
    assert {engines[replica] for replica in holders} == {"vllm"}


def test_a_key_file_is_0600_in_its_shard_and_holds_only_the_key(secrets_cluster: Cluster) -> None:
    found = keys(secrets_cluster)
    for replica, path in shards(secrets_cluster).items():
        source = engine_capabilities(read_state(path).spec.engine).key_input
        if not source.in_file:
            assert not (path / "api-key").exists() and not (path / "api-key.yaml").exists()
            continue
        key_file = path / source.filename
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert key_file.read_text() == source.file_text(found[replica])


def test_no_output_file_log_or_served_log_line_holds_a_key(secrets_cluster: Cluster) -> None:
    found = keys(secrets_cluster)
    outputs = list((secrets_cluster.home / "nodes" / "node1" / "work" / "shards").rglob("output-*.log"))
    assert len(outputs) >= 3
    sglang_output = b""
    for path in outputs:
        text = path.read_bytes()
        assert not holding(text, found), f"a key in {path}"
        if b"server_args=ServerArgs(" in text:
            sglang_output = text
    assert b"api_key='*****" in sglang_output, "SGLang printed its key and the agent blanked it in place"
    for name in ("server", "agent-node1"):
        assert not holding(secrets_cluster.log(name).read_bytes(), found), f"a key in the {name} log"
    for replica in found:
        served = secrets_cluster.admin.get(f"/api/replicas/{replica}/logs?lines=2000")["lines"]
        assert served, f"the logs API serves {replica}'s output"
        assert not holding("\n".join(served).encode(), found), f"a key in the lines served for {replica}"


def test_a_node_cannot_fetch_a_blob_of_a_model_it_does_not_run(secrets_cluster: Cluster) -> None:
    other = secrets_cluster.upload(filename="other.bin", data=b"weights of a model placed nowhere")
    node = secrets_cluster.home / "nodes" / "node1"
    connector = GrpcConnector(
        f"127.0.0.1:{secrets_cluster.agent_port}",
        TlsFiles(node / "ca.crt", node / "node.crt", node / "node.key"),
    )

    async def fetch(sha256: str) -> bytes:
        return b"".join([chunk async for chunk in connector.fetch(sha256)])

    placed = secrets_cluster.replicas("std-vllm")[0]
    assert placed["node"] == "node1"
    config_sha = read_state(shards(secrets_cluster)[placed["id"]]).spec.weights_sha256
    assert asyncio.run(fetch(config_sha)).startswith(b"{")  # its own replica's file
    with pytest.raises(Unauthorized, match="node node1 runs no replica with the file"):
        asyncio.run(fetch(other["sha256"]))
