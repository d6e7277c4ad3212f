"""The check a build must pass before an install accepts it (C4.2): what it runs and how it judges.

The llama.cpp builds here are :mod:`llmgw.testing.standin_builds`'s: each prints its version, so each
would have passed the old ``--version`` check; only some compute where they should.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from llmgw.engines import buildverdicts, checkmodel
from llmgw.engines.builds import install_best, installed, llamacpp_builds
from llmgw.engines.buildverdicts import CheckResult, NodeConditions
from llmgw.engines.checking import LlamaCppBuildCheck, llamacpp_verdict
from llmgw.engines.pythonchecks import python_verdict
from llmgw.testing.gguf_lora import tensor_shapes
from llmgw.testing.standin_builds import (
    Behaviour,
    fake_cudart_archive,
    fake_llama_server,
    fake_llamacpp_archive,
)

from .conftest import Serve
from .test_builds import TAG, FakeNet

H100 = "NVIDIA H100 80GB HBM3"
GPU_NODE = NodeConditions.of("580.82.07", [H100])


def test_the_check_model_is_a_llama_gguf_of_three_layers_the_same_on_every_node(tmp_path: Path) -> None:
    path = checkmodel.write_check_model(tmp_path)
    architecture, shapes = tensor_shapes(path)
    assert architecture == "llama"
    assert shapes["token_embd.weight"] == (128, 259) and shapes["output.weight"] == (128, 259)
    assert shapes["blk.1.ffn_down.weight"] == (256, 128) and "blk.2.attn_q.weight" not in shapes
    assert path.read_bytes() == checkmodel.gguf_bytes() == checkmodel.write_check_model(tmp_path).read_bytes()
    assert path.stat().st_size < 1_000_000


def test_node_conditions_are_the_driver_and_cards_and_nothing_else_on_a_cpu_node() -> None:
    assert str(GPU_NODE) == f"driver 580.82.07; 1x {H100}"
    assert NodeConditions.of("580.82.07", [H100, H100]) == NodeConditions("580.82.07", (H100, H100))
    assert NodeConditions.of("580.82.07", []) == NodeConditions() and not NodeConditions().gpu
    verdict = buildverdicts.reach("llama.cpp", "b1-cuda-13.4", CheckResult(False, "no token"), GPU_NODE)
    assert verdict.holds(GPU_NODE) and not verdict.holds(NodeConditions.of("590.1", [H100]))


def _server(tmp_path: Path, behaviour: Behaviour) -> Path:
    binary = tmp_path / f"llama-server-{behaviour}"
    binary.write_bytes(fake_llama_server(behaviour))
    binary.chmod(0o755)
    return binary


@pytest.mark.parametrize(
    ("behaviour", "ok", "found"),
    [
        ("cuda", True, "a token computed on CUDA0, 3 of 3 layers offloaded"),
        ("vulkan", True, "a token computed on Vulkan0, 3 of 3 layers offloaded"),
        (
            "layers-on-cpu",
            False,
            "a token computed on the CPU (build cuda-12.8): the build found no usable GPU",
        ),
        ("no-token", False, "did not answer a token: ggml_cuda_init: failed to initialize CUDA"),
        ("version", False, "did not answer a token: version: 1 (fake build)"),
    ],
)
async def test_a_build_on_a_gpu_node_must_answer_with_every_layer_on_the_card(
    tmp_path: Path, behaviour: Behaviour, ok: bool, found: str
) -> None:
    result = await LlamaCppBuildCheck(GPU_NODE, timeout_s=30)(_server(tmp_path, behaviour), "cuda-12.8")
    assert (result.ok, result.conclusive) == (ok, True)
    assert found in result.found
    assert bool(result.fix) is not ok


async def test_a_cpu_build_on_a_cpu_node_must_answer_a_token(tmp_path: Path) -> None:
    good = await LlamaCppBuildCheck(NodeConditions(), timeout_s=30)(_server(tmp_path, "cpu"), "cpu")
    bad = await LlamaCppBuildCheck(NodeConditions(), timeout_s=30)(_server(tmp_path, "version"), "cpu")
    assert good.ok and "a token computed on the CPU" in good.found
    assert not bad.ok and "did not answer a token" in bad.found


async def test_a_full_card_says_nothing_about_the_build(tmp_path: Path) -> None:
    result = await LlamaCppBuildCheck(GPU_NODE, timeout_s=30)(_server(tmp_path, "card-full"), "cuda-13.4")
    assert not result.ok and not result.conclusive
    assert "cudaMalloc failed: out of memory" in result.found and "nothing was recorded" in result.fix
    answered = llamacpp_verdict("cudaMalloc failed: out of memory\n", gpu=False, answered=False)
    assert answered.conclusive  # on a CPU node there is no card to be full


async def test_the_next_build_is_taken_when_one_runs_but_does_not_compute(
    serve: Serve, tmp_path: Path
) -> None:
    net = FakeNet()
    net.base = await serve(net.app())
    for label, behaviour in (("13.4", "no-token"), ("12.8", "layers-on-cpu")):
        net.assets[f"llama-{TAG}-bin-ubuntu-cuda-{label}-x64.tar.gz"] = fake_llamacpp_archive(behaviour)
        net.assets[f"cudart-llama-{TAG}-bin-ubuntu-cuda-{label}-x64.tar.gz"] = fake_cudart_archive()
    net.assets[f"llama-{TAG}-bin-ubuntu-vulkan-x64.tar.gz"] = fake_llamacpp_archive("vulkan")
    builds = llamacpp_builds(has_nvidia=True, driver_version="580.82.07", arch="x86_64")
    urls = {"release_api": f"{net.base}/repos/ggml-org/llama.cpp", "pypi_url": f"{net.base}/pypi"}

    result = await install_best(builds, tmp_path, check=LlamaCppBuildCheck(GPU_NODE, timeout_s=30), **urls)

    assert result.build.variant == "vulkan" and result.check is not None
    assert result.check.found == "a token computed on Vulkan0, 3 of 3 layers offloaded"
    assert [item.build.variant for item in installed(tmp_path)] == ["vulkan"]  # refused ones: not kept
    refused = {v.build: v for v in buildverdicts.refusals(tmp_path, "llama.cpp")}
    assert set(refused) == {f"{TAG}-cuda-13.4", f"{TAG}-cuda-12.8"}
    assert "failed to initialize CUDA" in refused[f"{TAG}-cuda-13.4"].found
    assert "found no usable GPU" in refused[f"{TAG}-cuda-12.8"].found
    assert all(v.node == str(GPU_NODE) and "--retry-refused" in v.fix for v in refused.values())


def test_what_a_python_build_probe_printed_is_judged() -> None:
    python = Path("/venv/bin/python")
    killed = python_verdict("vllm", python, gpu=False, code=-signal.SIGILL, output="")
    assert not killed.ok and "killed by SIGILL (an instruction this CPU lacks)" in killed.found
    wrong = '{"torch": "2.13.0+cpu", "cuda": null, "kernel_difference": 0.5}'
    assert (
        "computed wrong numbers (off by 0.5)"
        in python_verdict("vllm", python, gpu=False, code=0, output=wrong).found
    )
    cards = '{"torch": "2.9.0", "cuda": "13.0", "available": true, "devices": ["A", "A"], '
    cards += '"extension": "sgl_kernel"}'
    seen = python_verdict("sglang", python, gpu=True, code=0, output="noise\n" + cards)
    assert seen.ok and seen.found.endswith("sgl_kernel imports and torch 2.9.0 (CUDA 13.0) sees 2 card(s): A")
