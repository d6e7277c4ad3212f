"""The agent takes an engine build only once it computes on the node, else the next (C4.2).

The mirror holds three llama.cpp builds for an NVIDIA node, each printing its version as a good
one does: CUDA 13.4 answers no token (its CUDA does not start), CUDA 12.8 answers one with every
layer on the CPU, Vulkan with every layer on the card.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from llmgw.agent.config import AgentConfig
from llmgw.agent.installing import Installer
from llmgw.core.devices import Device, NodeInventory
from llmgw.core.mirrorbuilds import BuildAsset, MirrorBuilds, MirroredBuild
from llmgw.engines import buildverdicts
from llmgw.engines.builds import LLAMACPP_TAG, llamacpp_builds
from llmgw.mirror.blobs import BlobStore
from llmgw.testing.standin_builds import Behaviour, fake_cudart_archive, fake_llamacpp_archive

UNREACHABLE = "http://127.0.0.1:9"
H100 = "NVIDIA H100 80GB HBM3"


async def _mirror(tmp_path: Path) -> tuple[BlobStore, MirrorBuilds]:
    blobs = BlobStore(tmp_path / "mirror")
    behaviours: dict[str, Behaviour] = {
        "cuda-13.4": "no-token",
        "cuda-12.8": "layers-on-cpu",
        "vulkan": "vulkan",
    }
    held = []
    for build in llamacpp_builds(has_nvidia=True, driver_version="580.82.07", arch="x86_64"):
        assets = []
        for index, name in enumerate(build.assets):
            file = tmp_path / name
            kind = behaviours[build.variant]
            archive = fake_llamacpp_archive(kind) if index == 0 else fake_cudart_archive()
            file.write_bytes(archive)
            info = await blobs.import_file(file)
            assets.append(BuildAsset(name, info.sha256, info.size))
        held.append(MirroredBuild("llama.cpp", LLAMACPP_TAG, build.variant, "x64", tuple(assets)))
    return blobs, MirrorBuilds(tuple(held))


def _installer(tmp_path: Path, blobs: BlobStore) -> Installer:
    config = AgentConfig(
        node_id="n1",
        control_planes=["127.0.0.1:1"],
        work_dir=str(tmp_path / "work"),
        cache_dir=str(tmp_path / "cache"),
        engines={"llamacpp": {"release_api": UNREACHABLE, "pypi_url": UNREACHABLE}},  # offline
    )
    card = Device("nvidia", 0, H100, 81559, 81559, device_class="h100-80g")
    inventory = NodeInventory(node_id="n1", address="127.0.0.1", cpu_cores=2, memory_mb=4096,
                              devices=(card,), driver_version="580.82.07")  # fmt: skip

    def fetcher() -> object:
        async def fetch(sha256: str, offset: int) -> AsyncIterator[bytes]:
            async for chunk in blobs.read_chunks(sha256, offset):
                yield chunk

        return fetch

    return Installer(config, lambda: inventory, fetcher)  # type: ignore[arg-type]


async def test_the_agent_refuses_builds_that_do_not_compute_on_its_cards_and_takes_the_next(
    tmp_path: Path,
) -> None:
    blobs, held = await _mirror(tmp_path)
    installer = _installer(tmp_path, blobs)
    installer.mirror.use(held)

    binary = await installer.engine()

    cache = tmp_path / "cache"
    assert binary == cache / "engines/llama.cpp" / f"{LLAMACPP_TAG}-vulkan/llama-server"
    refused = {v.build: v.found for v in buildverdicts.refusals(cache, "llama.cpp")}
    assert set(refused) == {f"{LLAMACPP_TAG}-cuda-13.4", f"{LLAMACPP_TAG}-cuda-12.8"}
    assert "did not answer a token" in refused[f"{LLAMACPP_TAG}-cuda-13.4"]
    assert "a token computed on the CPU" in refused[f"{LLAMACPP_TAG}-cuda-12.8"]
    assert installer.installed_engines() == [f"llama.cpp {LLAMACPP_TAG} vulkan"]

    restarted = _installer(tmp_path, blobs)  # the agent starts again: the mirror not yet heard from
    assert await restarted.engine() == binary  # accepted here: taken without a check or a download
