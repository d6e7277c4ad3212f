"""llmgw ctl engine-check with the real llama.cpp build and SmolLM2 (C4.4)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmgw.cli import ctl
from llmgw.testing.nvidia_smi_standin import H100_80G, install_fake_nvidia_smi

pytestmark = pytest.mark.e2e


def _check(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(ctl.app, ["engine-check", *args])
    return result.exit_code, " ".join(result.output.split())


def test_the_cpu_build_answers_a_token_on_a_machine_without_gpus(
    engine_cache: Path, model_file: Path
) -> None:
    code, output = _check(
        "--cache-dir", str(engine_cache), "--model", str(model_file), "--nvidia-smi", "/nonexistent"
    )
    assert code == 0, output
    assert "a token computed on the CPU" in output


def test_the_cpu_build_fails_on_a_machine_with_nvidia_gpus_naming_the_fix(
    engine_cache: Path, model_file: Path, tmp_path: Path
) -> None:
    smi = install_fake_nvidia_smi(tmp_path / "bin", [H100_80G])
    code, output = _check(
        "--cache-dir", str(engine_cache), "--model", str(model_file), "--nvidia-smi", str(smi)
    )
    assert code == 1
    assert "a token computed on the CPU (build cpu-source): the build found no usable GPU" in output
    assert "fix: install a CUDA build of llama.cpp" in output
