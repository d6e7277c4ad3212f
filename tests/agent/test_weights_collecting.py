"""Weights no shard uses are removed past their keep time, oldest first, once the folder holds too much."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from pathlib import Path

import pytest

from llmgw.agent.weightfiles import model_folder
from llmgw.agent.weights_collecting import Kept, WeightsCollector, choose, used_files
from llmgw.core.shards import AdapterSpec, ShardSpec, WeightsFile
from llmgw.testing.clock import FakeClock
from llmgw.testing.eventually import eventually

HOUR = 3600.0


def sha(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def spec(replica: str, *files: str, safetensors: bool = False) -> ShardSpec:
    main, *extra = files
    return ShardSpec(
        replica_id=replica,
        model="m",
        weights_sha256=sha(main),
        weights_filename=main,
        weights_size=1000,
        weights_format="safetensors" if safetensors else "gguf",
        files=tuple(WeightsFile(sha(name), name, 10) for name in extra),
    )


def test_nothing_goes_while_the_folder_is_within_its_limit() -> None:
    kept = [Kept(sha("a"), 400, 0.0), Kept(sha("b"), 600, 0.0)]
    assert choose(kept, set(), now=100 * HOUR, keep_s=HOUR, max_bytes=1000) == []


def test_the_longest_unused_go_first_and_only_until_the_folder_is_within_its_limit() -> None:
    now = 100 * HOUR
    kept = [
        Kept(sha("newer"), 400, now - 30 * HOUR),
        Kept(sha("oldest"), 400, now - 90 * HOUR),
        Kept(sha("older"), 400, now - 50 * HOUR),
        Kept(sha("used"), 400, now - 99 * HOUR),
        Kept(sha("recent"), 400, now - 0.5 * HOUR),
    ]
    chosen = choose(kept, {sha("used")}, now, keep_s=24 * HOUR, max_bytes=1000)
    assert [r.kept.sha256 for r in chosen] == [sha("oldest"), sha("older"), sha("newer")]
    assert chosen[0].reason == (
        "no shard used it for 90.0 h and the weights folder held 0.0 GB, over weights_max_gb 1e-06"
    )
    # the used one and the one inside its keep time stay, even though the folder is still over
    assert choose(kept[3:], {sha("used")}, now, keep_s=24 * HOUR, max_bytes=0) == []


def test_a_shards_files_and_model_folders_count_as_used() -> None:
    base = spec("r1", "model.safetensors", "config.json", safetensors=True)
    adapter = AdapterSpec(
        "lora",
        sha("adapter.safetensors"),
        "adapter.safetensors",
        5,
        files=(WeightsFile(sha("a.json"), "adapter_config.json", 1),),
    )
    files, folders = used_files(
        [base, ShardSpec(replica_id="r2", model="m", weights_sha256=sha("g"), adapters=(adapter,))]
    )
    assert files == {
        sha(n) for n in ("model.safetensors", "config.json", "g", "adapter.safetensors", "a.json")
    }
    assert len(folders) == 2


class Node:
    """A weights folder on disk, the shards using it and the collector, on a fake clock."""

    def __init__(self, root: Path, max_gb: float = 2500 / 1e9) -> None:
        self.dir = root / "weights"
        self.clock = FakeClock()
        self.specs: list[ShardSpec] = []
        self.locks: dict[str, asyncio.Lock] = {}
        self.locked: list[str] = []
        self.collector = WeightsCollector(
            self.dir, lambda: self.specs, self.lock, keep_hours=24, max_gb=max_gb, clock=self.clock
        )

    def lock(self, digest: str) -> asyncio.Lock:
        self.locked.append(digest)
        return self.locks.setdefault(digest, asyncio.Lock())

    def fetched(self, name: str, size: int, hours_ago: float) -> Path:
        folder = self.dir / sha(name)
        folder.mkdir(parents=True)
        (folder / name).write_bytes(b"w" * size)
        at = self.clock.time() - hours_ago * HOUR
        os.utime(folder, (at, at))
        return folder / name

    def present(self) -> set[str]:
        return {p.name for p in self.dir.iterdir() if p.name != "models"}


async def test_unused_weights_go_oldest_first_and_used_ones_stay_however_old(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = Node(tmp_path)
    node.fetched("old.gguf", 1000, hours_ago=72)
    node.fetched("older.gguf", 1000, hours_ago=96)
    node.fetched("used.gguf", 1000, hours_ago=500)
    node.fetched("fresh.gguf", 1000, hours_ago=1)
    node.specs = [spec("r1", "used.gguf")]
    with caplog.at_level(logging.INFO, logger="llmgw.agent.weights_collecting"):
        removed = await node.collector.collect()
    assert [r.kept.sha256 for r in removed] == [sha("older.gguf"), sha("old.gguf")]
    assert node.present() == {sha("used.gguf"), sha("fresh.gguf")}
    assert f"removed weights {sha('older.gguf')[:12]}… (0.0 GB): no shard used it for 96.0 h" in caplog.text
    # in use, its last use is now: a shard that stops leaves it its whole keep time
    assert (node.dir / sha("used.gguf")).stat().st_mtime == node.clock.time()


async def test_a_shard_starting_with_a_file_while_it_is_chosen_keeps_it(tmp_path: Path) -> None:
    node = Node(tmp_path, max_gb=0)
    node.fetched("old.gguf", 1000, hours_ago=72)
    held = node.lock(sha("old.gguf"))
    node.locked.clear()
    await held.acquire()  # the installer checks the file for a shard starting now
    collecting = asyncio.create_task(node.collector.collect())
    await eventually(lambda: node.locked == [sha("old.gguf")])
    node.specs = [spec("r1", "old.gguf")]
    held.release()
    assert await collecting == []
    assert node.present() == {sha("old.gguf")}


async def test_a_model_folder_goes_with_its_weights_and_a_used_one_stays(tmp_path: Path) -> None:
    node = Node(tmp_path, max_gb=0)
    gone = [("model.safetensors", sha("model.safetensors"), node.fetched("model.safetensors", 100, 48))]
    kept = [("keep.safetensors", sha("keep.safetensors"), node.fetched("keep.safetensors", 100, 48))]
    gone_folder = model_folder(node.dir, gone)
    kept_folder = model_folder(node.dir, kept)
    node.specs = [spec("r1", "keep.safetensors", safetensors=True)]
    removed = await node.collector.collect()
    assert [r.kept.sha256 for r in removed] == [sha("model.safetensors")]
    assert not gone_folder.exists()
    assert (kept_folder / "keep.safetensors").read_bytes() == b"w" * 100
