"""Weights found on disk are reused only when their sha256 matches; a model's folder is its own (C9.1)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from llmgw.agent.config import AgentConfig
from llmgw.agent.installing import BlobFetcher, Installer
from llmgw.agent.metrics import REGISTRY as AGENT_METRICS
from llmgw.agent.weightfiles import digest_file, model_folder, reusable
from llmgw.core.devices import NodeInventory
from llmgw.core.shards import ShardSpec, WeightsFile

BASE = b"base weights " * 1000
CONFIG_A = b'{"architectures": ["A"]}'
CONFIG_B = b'{"architectures": ["B"]}'
TOKENIZER = b'{"tokenizer": true}'


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Mirror:
    """Blobs by sha256, in chunks from the asked offset; counts the fetches of each."""

    def __init__(self, *blobs: bytes) -> None:
        self.blobs = {sha(b): b for b in blobs}
        self.fetched: list[str] = []

    def fetcher(self) -> BlobFetcher:
        async def fetch(digest: str, offset: int) -> AsyncIterator[bytes]:
            self.fetched.append(digest)
            data = self.blobs[digest]
            for start in range(offset, len(data), 4096):
                yield data[start : start + 4096]

        return fetch


def installer(tmp_path: Path, mirror: Mirror) -> Installer:
    config = AgentConfig(node_id="n1", control_planes=["127.0.0.1:1"], work_dir=str(tmp_path / "work"))
    return Installer(config, lambda: NodeInventory(node_id="n1"), mirror.fetcher)


def gguf(data: bytes = BASE) -> ShardSpec:
    return ShardSpec(
        replica_id="r1",
        model="m",
        weights_sha256=sha(data),
        weights_filename="m.gguf",
        weights_size=len(data),
    )


def safetensors(model: str, config: bytes) -> ShardSpec:
    return ShardSpec(
        replica_id=f"r-{model}",
        model=model,
        weights_sha256=sha(BASE),
        weights_filename="model.safetensors",
        weights_size=len(BASE),
        weights_format="safetensors",
        files=(
            WeightsFile(sha256=sha(config), filename="config.json", size=len(config)),
            WeightsFile(sha256=sha(TOKENIZER), filename="tokenizer.json", size=len(TOKENIZER)),
        ),
    )


async def test_a_fetched_file_is_reused_without_hashing_it_again(tmp_path: Path) -> None:
    mirror = Mirror(BASE)
    path = await installer(tmp_path, mirror).weights(gguf())
    assert digest_file(path).exists()
    stat = path.stat()
    path.write_bytes(b"y" * len(BASE))  # bytes that do not match, the size and times put back:
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # only hashing again would notice
    again = await installer(tmp_path, mirror).weights(gguf())
    assert again == path and mirror.fetched == [sha(BASE)]


async def test_a_file_found_by_name_with_other_bytes_is_fetched_again(tmp_path: Path) -> None:
    mirror = Mirror(BASE)
    path = await installer(tmp_path, mirror).weights(gguf())
    path.write_bytes(b"x" * len(BASE))  # same size, other bytes, new modification time
    again = await installer(tmp_path, mirror).weights(gguf())
    assert again.read_bytes() == BASE and mirror.fetched == [sha(BASE), sha(BASE)]


async def test_a_file_found_without_a_kept_digest_is_hashed_once_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "work" / "weights" / sha(BASE) / "m.gguf"
    path.parent.mkdir(parents=True)
    path.write_bytes(BASE)
    mirror = Mirror(BASE)
    assert await installer(tmp_path, mirror).weights(gguf()) == path
    assert mirror.fetched == [] and digest_file(path).exists()


def test_a_kept_digest_of_a_file_that_changed_is_not_believed(tmp_path: Path) -> None:
    path = tmp_path / "w.gguf"
    path.write_bytes(BASE)
    assert reusable(path, sha(BASE))
    path.write_bytes(BASE[:-1] + b"!")
    assert not reusable(path, sha(BASE)) and not path.exists()


async def test_two_models_sharing_base_weights_keep_their_own_extra_files(tmp_path: Path) -> None:
    mirror = Mirror(BASE, CONFIG_A, CONFIG_B, TOKENIZER)
    node = installer(tmp_path, mirror)
    folder_a = await node.weights(safetensors("a", CONFIG_A))
    folder_b = await node.weights(safetensors("b", CONFIG_B))
    assert folder_a != folder_b
    assert (folder_a / "config.json").read_bytes() == CONFIG_A
    assert (folder_b / "config.json").read_bytes() == CONFIG_B
    assert (folder_a / "model.safetensors").samefile(folder_b / "model.safetensors")
    assert sorted(p.name for p in folder_a.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert sorted(mirror.fetched) == sorted({sha(BASE), sha(CONFIG_A), sha(CONFIG_B), sha(TOKENIZER)})
    assert await installer(tmp_path, mirror).weights(safetensors("a", CONFIG_A)) == folder_a
    assert len(mirror.fetched) == 4


async def test_the_bytes_fetched_are_counted_and_a_reused_file_adds_none(tmp_path: Path) -> None:
    before = AGENT_METRICS.get_sample_value("llmgw_agent_weights_fetched_bytes_total") or 0.0
    mirror = Mirror(BASE)
    await installer(tmp_path, mirror).weights(gguf())
    await installer(tmp_path, mirror).weights(gguf())

    assert AGENT_METRICS.get_sample_value("llmgw_agent_weights_fetched_bytes_total") == before + len(BASE)


def test_two_shards_making_one_model_folder_at_once_both_get_it_whole(tmp_path: Path) -> None:
    """Two shards of a model taking the same adapter at once make its folder in two threads: each gets
    the folder with every file, and no partial folder is left."""
    weights = tmp_path / "weights"
    files = []
    for index, name in enumerate(("adapter_config.json", "adapter_model.safetensors", "extra/tokens.json")):
        blob = weights / f"blob{index}" / Path(name).name
        blob.parent.mkdir(parents=True)
        blob.write_bytes(name.encode() * 100)
        files.append((name, f"{index:064x}", blob))
    barrier = threading.Barrier(8)

    def make() -> Path:
        barrier.wait()
        return model_folder(weights, files)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        made = {future.result() for future in [pool.submit(make) for _ in range(8)]}
    (folder,) = made
    assert all((folder / name).samefile(path) for name, _, path in files)
    assert [p.name for p in folder.parent.iterdir()] == [folder.name], "no partial folder left"
