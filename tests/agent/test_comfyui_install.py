"""ComfyUI on a node is the operator's: agent.yaml's engines.comfyui.python and .main, both checked."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.agent.config import AgentConfig, ComfyuiRecipeSettings, ComfyuiSettings, EngineSettings
from llmgw.agent.installing import BlobFetcher, Installer
from llmgw.core.devices import NodeInventory
from llmgw.core.shards import ShardSpec
from llmgw.engines.comfyui_builds import TORCH_BUILDS, recipe
from llmgw.engines.comfyui_install import comfyui_dir
from llmgw.errors import LlmgwError

WEIGHTS = b"checkpoint" * 10


def fetcher() -> BlobFetcher:
    async def fetch(digest: str, offset: int) -> AsyncIterator[bytes]:
        yield WEIGHTS[offset:]

    return fetch


def installer(tmp_path: Path, python: str = "", main: str = "") -> Installer:
    config = AgentConfig(
        node_id="n1",
        control_planes=["127.0.0.1:1"],
        work_dir=str(tmp_path / "work"),
        engines=EngineSettings(comfyui=ComfyuiSettings(python=python, main=main)),
    )
    return Installer(config, lambda: NodeInventory(node_id="n1"), fetcher)


async def test_a_node_without_comfyui_says_which_settings_to_set(tmp_path: Path) -> None:
    with pytest.raises(LlmgwError, match=r"engines\.comfyui\.python and \.main are not set"):
        await installer(tmp_path).program("comfyui")


async def test_a_missing_main_is_named(tmp_path: Path) -> None:
    (tmp_path / "python").write_text("")
    with pytest.raises(LlmgwError, match=r"engines\.comfyui\.main names .*main\.py, which is not a file"):
        await installer(tmp_path, str(tmp_path / "python"), str(tmp_path / "main.py")).program("comfyui")


async def test_a_comfyui_shard_starts_from_the_operators_python_and_main(tmp_path: Path) -> None:
    for name in ("python", "main.py"):
        (tmp_path / name).write_text("")
    spec = ShardSpec(
        replica_id="r1", model="flux", engine="comfyui", weights_sha256=hashlib.sha256(WEIGHTS).hexdigest(),
        weights_filename="flux1-schnell.safetensors", weights_size=len(WEIGHTS), weights_format="safetensors",
    )  # fmt: skip
    prepared = await installer(tmp_path, str(tmp_path / "python"), str(tmp_path / "main.py")).prepare(spec)
    assert prepared.program == tmp_path / "python" and prepared.entry == tmp_path / "main.py"
    assert (prepared.weights / "flux1-schnell.safetensors").read_bytes() == WEIGHTS


async def test_a_node_given_a_recipe_starts_from_the_build_it_installed_and_keeps(tmp_path: Path) -> None:
    wanted = ComfyuiRecipeSettings(version="0.3.60", sha256="c" * 64, released="2025-09-23")
    config = AgentConfig(
        node_id="n1",
        control_planes=["127.0.0.1:1"],
        work_dir=str(tmp_path / "work"),
        cache_dir=str(tmp_path / "cache"),
        engines=EngineSettings(comfyui=ComfyuiSettings(recipe=wanted)),
    )
    kept = comfyui_dir(config.cache_path, recipe("0.3.60", "c" * 64, "2025-09-23"), TORCH_BUILDS[1])
    (kept / "venv/bin").mkdir(parents=True)
    (kept / "ComfyUI").mkdir()
    python, main = kept / "venv/bin/python", kept / "ComfyUI/main.py"
    python.write_text("")
    main.write_text("")
    (kept / "build.json").write_text(
        f'{{"python": "{python}", "main": "{main}", "torch": "{TORCH_BUILDS[1].variant}"}}'
    )
    inventory = NodeInventory(node_id="n1", address="127.0.0.1", cpu_cores=2, memory_mb=4096)
    found = await Installer(config, lambda: inventory, fetcher).comfyui()
    assert found == (python, main)  # the installed build is kept: nothing is downloaded
