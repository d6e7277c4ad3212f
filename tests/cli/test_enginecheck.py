"""llmgw ctl engine-check: a build proves it computes where it should, or the check names the fix."""

from __future__ import annotations

import sys

from typer.testing import CliRunner

from llmgw.cli import ctl
from llmgw.engines.checking import llamacpp_verdict

CUDA_OUTPUT = """\
llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H100 80GB HBM3) - 80000 MiB free
load_tensors: offloading 24 repeating layers to GPU
load_tensors: offloaded 25/25 layers to GPU
load_tensors:        CUDA0 model buffer size =    80.00 MiB
"""


def _check(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(ctl.app, ["engine-check", *args])
    return result.exit_code, " ".join(result.output.split())


def test_a_cuda_build_that_offloaded_every_layer_passes() -> None:
    verdict = llamacpp_verdict(CUDA_OUTPUT, gpu=True, answered=True)
    assert verdict.ok and verdict.found == "a token computed on CUDA0, 25 of 25 layers offloaded"


def test_a_build_that_kept_layers_on_the_cpu_fails_naming_the_fix() -> None:
    output = CUDA_OUTPUT.replace("offloaded 25/25", "offloaded 20/25")
    verdict = llamacpp_verdict(output, gpu=True, answered=True, variant="cuda-12.8")
    assert not verdict.ok
    assert "only 20 of 25 layers" in verdict.found and "llmgw engine install" in verdict.fix


def test_a_build_that_answered_nothing_fails() -> None:
    verdict = llamacpp_verdict("error: cannot load model\n", gpu=False, answered=False)
    assert not verdict.ok and "cannot load model" in verdict.found


def test_trtllm_without_its_python_set_names_the_setting() -> None:
    code, output = _check("trtllm")
    assert code == 1 and "engines.trtllm.python" in output


def test_trtllm_with_a_python_that_lacks_it_names_the_install() -> None:
    code, output = _check("trtllm", "--bin", sys.executable)
    assert code == 1 and "cannot import tensorrt_llm" in output and "pip install tensorrt-llm" in output


def test_sglang_that_does_not_start_fails_naming_the_fix() -> None:
    code, output = _check("sglang", "--bin", sys.executable)
    assert code == 1 and "SGLang does not start" in output and "install SGLang" in output


def test_an_unknown_engine_is_named() -> None:
    code, output = _check("tgi")
    assert code == 1 and "no engine 'tgi'" in output
