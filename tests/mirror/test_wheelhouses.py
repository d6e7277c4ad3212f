"""vLLM's and SGLang's wheels in the mirror: downloaded once, recorded, installed from with no index."""

from __future__ import annotations

import platform
import shutil
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from llmgw.agent.config import AgentConfig
from llmgw.agent.installing import Installer
from llmgw.core.devices import Device, NodeInventory
from llmgw.engines import buildverdicts
from llmgw.errors import BuildError, ValidationFailed
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.builds import BuildIndex
from llmgw.mirror.wheelhouses import add_wheelhouse, python_build
from llmgw.testing.standin_builds import fake_engine_wheel
from llmgw.testing.standin_wheels import engine_wheels


class Pip:
    """pip download, answered from wheels the test made; records the arguments."""

    def __init__(self, wheels: list[Path], code: int = 0) -> None:
        self.wheels = wheels
        self.code = code
        self.asked: list[list[str]] = []

    async def __call__(self, arguments: Sequence[str]) -> tuple[int, str]:
        self.asked.append(list(arguments))
        dest = Path(arguments[arguments.index("--dest") + 1])
        for wheel in self.wheels:
            shutil.copy(wheel, dest / wheel.name)
        return self.code, "" if self.code == 0 else "ERROR: No matching distribution found for vllm===0.33.0"


async def test_a_wheelhouse_is_downloaded_imported_and_recorded(tmp_path: Path) -> None:
    wheels = [fake_engine_wheel(tmp_path, "vllm", "0.33.0"), fake_engine_wheel(tmp_path, "helper", "1.0")]
    blobs, index = BlobStore(tmp_path / "mirror"), BuildIndex(tmp_path / "mirror")
    pip = Pip(wheels)
    held = await add_wheelhouse(blobs, index, python_build("vllm", "", "cu129"), pip=pip, arch="x86_64")
    assert [asset.name for asset in held.assets] == sorted(w.name for w in wheels)
    assert all(blobs.has(asset.sha256) for asset in held.assets)
    assert index.all() == [held] and held.key == "vllm 0.33.0 cu129 x86_64"
    (asked,) = pip.asked
    assert asked[0] == "download" and ":all:" in asked and "vllm===0.33.0" in asked


async def test_a_failed_download_names_the_build_and_records_nothing(tmp_path: Path) -> None:
    blobs, index = BlobStore(tmp_path / "mirror"), BuildIndex(tmp_path / "mirror")
    with pytest.raises(BuildError) as caught:
        await add_wheelhouse(blobs, index, python_build("vllm", "", "cu129"), pip=Pip([], code=1))
    assert "vllm===0.33.0" in caught.value.message and index.all() == []


def test_an_unknown_engine_or_variant_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValidationFailed):
        python_build("llama.cpp", "", "cu129")
    with pytest.raises(ValidationFailed) as caught:
        python_build("sglang", "", "cu999")
    assert "cu130" in caught.value.hint


async def test_an_offline_node_installs_vllm_from_the_mirrors_wheelhouse(tmp_path: Path) -> None:
    blobs, index = BlobStore(tmp_path / "mirror"), BuildIndex(tmp_path / "mirror")
    wheels = engine_wheels(tmp_path / "wheels", "vllm", "0.33.0")  # vLLM and the torch it needs
    await add_wheelhouse(
        blobs, index, python_build("vllm", "", "cu129"), pip=Pip(wheels), arch=platform.machine()
    )
    fetched: list[str] = []

    def fetcher() -> object:
        async def fetch(sha256: str, offset: int) -> AsyncIterator[bytes]:
            fetched.append(sha256)
            async for chunk in blobs.read_chunks(sha256, offset):
                yield chunk

        return fetch

    config = AgentConfig(
        node_id="n1",
        control_planes=["127.0.0.1:1"],
        work_dir=str(tmp_path / "work"),
        cache_dir=str(tmp_path / "cache"),
        engines={"vllm": {"index_url": "http://127.0.0.1:9/simple"}},  # no index answers: offline
    )
    card = Device("nvidia", 0, "NVIDIA H100 80GB HBM3", 81559, 81559, device_class="h100-80g")
    inventory = NodeInventory(node_id="n1", address="127.0.0.1", cpu_cores=2, memory_mb=4096,
                              devices=(card,), driver_version="580.82.07")  # fmt: skip
    installer = Installer(config, lambda: inventory, fetcher)  # type: ignore[arg-type]
    installer.mirror.use(index.message())
    program = await installer.program("vllm")
    assert program.name == "vllm" and program.is_file()
    assert sorted(fetched) == sorted(asset.sha256 for asset in index.all()[0].assets)


async def test_a_wheelhouse_build_that_runs_but_does_not_compute_is_refused_for_the_next(
    tmp_path: Path,
) -> None:
    blobs, index = BlobStore(tmp_path / "mirror"), BuildIndex(tmp_path / "mirror")
    arch = platform.machine()
    good = engine_wheels(tmp_path / "good", "vllm", "0.33.0")
    no_extension = engine_wheels(
        tmp_path / "bad", "vllm", "0.33.0+cu130", fault="extension"
    )  # runs --version
    await add_wheelhouse(blobs, index, python_build("vllm", "", "cu130"), pip=Pip(no_extension), arch=arch)
    await add_wheelhouse(blobs, index, python_build("vllm", "", "cu129"), pip=Pip(good), arch=arch)

    def fetcher() -> object:
        return blobs.read_chunks

    cache = tmp_path / "cache"
    config = AgentConfig(
        node_id="n1",
        control_planes=["127.0.0.1:1"],
        work_dir=str(tmp_path / "work"),
        cache_dir=str(cache),
        engines={"vllm": {"index_url": "http://127.0.0.1:9/simple"}},  # no index answers: offline
    )
    card = Device("nvidia", 0, "NVIDIA H100 80GB HBM3", 81559, 81559, device_class="h100-80g")
    inventory = NodeInventory(node_id="n1", address="127.0.0.1", cpu_cores=2, memory_mb=4096,
                              devices=(card,), driver_version="580.82.07")  # fmt: skip
    installer = Installer(config, lambda: inventory, fetcher)  # type: ignore[arg-type]
    installer.mirror.use(index.message())

    program = await installer.program("vllm")

    assert program == cache / "engines/vllm/0.33.0-cu129/venv/bin/vllm"
    (refused,) = buildverdicts.refusals(cache, "vllm")
    assert refused.build == "0.33.0-cu130" and "vllm._C does not import" in refused.found
    assert not (cache / "engines/vllm/0.33.0-cu130").exists()
    assert installer.installed_engines() == ["vllm 0.33.0 cu129"]
