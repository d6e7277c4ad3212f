"""A model's LoRA adapters reach the node with its weights: checked, resumed, in their own folder."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.agent.config import AgentConfig
from llmgw.agent.installing import BlobFetcher, Installer
from llmgw.agent.shardstates import ShardRecord, read_state, write_state
from llmgw.core.devices import NodeInventory
from llmgw.core.shards import AdapterSpec, ShardSpec, WeightsFile
from llmgw.errors import ChecksumMismatch

WEIGHTS = b"lora weights " * 100
CONFIG = b'{"peft_type": "LORA", "r": 8}'


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Mirror:
    """Blobs by sha256, served in chunks from the asked offset; records every request."""

    def __init__(self, *blobs: bytes) -> None:
        self.blobs = {sha(b): b for b in blobs}
        self.asked: list[tuple[str, int]] = []

    def fetcher(self) -> BlobFetcher:
        async def fetch(digest: str, offset: int) -> AsyncIterator[bytes]:
            self.asked.append((digest, offset))
            data = self.blobs[digest]
            for start in range(offset, len(data), 256):
                yield data[start : start + 256]

        return fetch


def installer(tmp_path: Path, mirror: Mirror) -> Installer:
    config = AgentConfig(node_id="n1", control_planes=["127.0.0.1:1"], work_dir=str(tmp_path / "work"))
    return Installer(config, lambda: NodeInventory(node_id="n1"), mirror.fetcher)


def peft_spec(weights_sha: str = sha(WEIGHTS)) -> tuple[ShardSpec, AdapterSpec]:
    adapter = AdapterSpec(
        name="sql",
        sha256=weights_sha,
        filename="adapter_model.safetensors",
        size=len(WEIGHTS),
        files=(WeightsFile(sha256=sha(CONFIG), filename="adapter_config.json", size=len(CONFIG)),),
    )
    return ShardSpec(replica_id="r1", model="base", adapters=(adapter,)), adapter


async def test_a_peft_adapter_becomes_a_folder_of_its_files(tmp_path: Path) -> None:
    spec, adapter = peft_spec()
    fetched = await installer(tmp_path, Mirror(WEIGHTS, CONFIG)).adapter(spec, adapter)
    assert (fetched.name, fetched.scale) == ("sql", None)
    assert (fetched.path / "adapter_model.safetensors").read_bytes() == WEIGHTS
    assert (fetched.path / "adapter_config.json").read_bytes() == CONFIG


async def test_a_gguf_adapter_is_its_file_with_its_scale(tmp_path: Path) -> None:
    adapter = AdapterSpec(
        name="tone", sha256=sha(WEIGHTS), filename="tone.gguf", size=len(WEIGHTS), scale=0.5
    )
    spec = ShardSpec(replica_id="r1", model="small", adapters=(adapter,))
    fetched = await installer(tmp_path, Mirror(WEIGHTS)).adapter(spec, adapter)
    assert fetched.path.name == "tone.gguf" and fetched.path.read_bytes() == WEIGHTS
    assert fetched.scale == 0.5


async def test_an_adapter_download_cut_short_resumes_where_it_stopped(tmp_path: Path) -> None:
    spec, adapter = peft_spec()
    mirror = Mirror(WEIGHTS, CONFIG)
    partial = tmp_path / "work" / "weights" / sha(WEIGHTS) / "adapter_model.safetensors.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(WEIGHTS[:700])
    await installer(tmp_path, mirror).adapter(spec, adapter)
    assert (sha(WEIGHTS), 700) in mirror.asked


async def test_an_adapter_whose_bytes_do_not_match_is_refused(tmp_path: Path) -> None:
    spec, adapter = peft_spec()
    mirror = Mirror(WEIGHTS, CONFIG)
    mirror.blobs[sha(WEIGHTS)] = b"x" * len(WEIGHTS)
    with pytest.raises(ChecksumMismatch):
        await installer(tmp_path, mirror).adapter(spec, adapter)


def test_a_shards_adapter_paths_survive_in_its_state_file(tmp_path: Path) -> None:
    record = ShardRecord(spec=ShardSpec(replica_id="r1"), adapter_paths={"sql": "/w/weights/aa"})
    write_state(tmp_path, record)
    assert read_state(tmp_path).adapter_paths == {"sql": "/w/weights/aa"}
