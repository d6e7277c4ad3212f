"""Where a shard computes: the engine's output, and the memory nvidia-smi sees its processes hold."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from llmgw.agent.compute import compute_of, memory_held, refusal
from llmgw.agent.nvidia_smi import NvidiaSmi
from llmgw.core.shards import Compute as ShardCompute
from llmgw.engines.engine import Compute
from llmgw.engines.llamacpp import parse_compute
from llmgw.testing.nvidia_smi_standin import H100_80G, FakeProcess, install_fake_nvidia_smi

ENGINE, CHILD, FOREIGN = 5001, 5002, 7777


async def _report(tmp_path: Path):  # type: ignore[no-untyped-def]
    cards = [
        replace(
            H100_80G, processes=(FakeProcess(ENGINE, "llama-server", 9000), FakeProcess(FOREIGN, "x", 50))
        ),
        replace(H100_80G, processes=(FakeProcess(CHILD, "worker", 7000),)),
        H100_80G,
    ]
    return await NvidiaSmi(str(install_fake_nvidia_smi(tmp_path / "bin", cards))).read()


async def test_memory_per_card_is_what_the_shards_processes_hold(tmp_path: Path) -> None:
    held = memory_held(await _report(tmp_path), {ENGINE, CHILD})
    assert held == {0: 9000, 1: 7000}


async def test_silent_output_takes_its_cards_from_nvidia_smi(tmp_path: Path) -> None:
    held = memory_held(await _report(tmp_path), {ENGINE, CHILD})
    compute = compute_of(parse_compute("main: server is listening\n"), held)
    assert compute == ShardCompute(backend="cuda", devices=(0, 1), memory_mb=16000)


async def test_the_engines_word_on_devices_and_layers_wins_with_memory_from_the_cards(tmp_path: Path) -> None:
    output = "load_tensors: offloaded 31/31 layers to GPU\nload_tensors: CUDA0 model buffer size = 90 MiB\n"
    held = memory_held(await _report(tmp_path), {ENGINE})
    assert compute_of(parse_compute(output), held) == ShardCompute(
        backend="cuda", devices=(0,), layers_offloaded=31, memory_mb=9000
    )


def test_without_cards_nor_word_a_shard_computes_on_the_cpu() -> None:
    assert compute_of(Compute(), None) == ShardCompute(backend="cpu")
    assert memory_held(None, {1}) is None


def test_a_shard_given_gpus_that_found_none_is_refused_naming_the_fix() -> None:
    output = "warning: no usable GPU found, --gpu-layers option will be ignored\n"
    why = refusal(output, parse_compute(output), [0])
    assert "found no usable GPU" in why and "engine-check" in why
    assert refusal(output, parse_compute(output), []) == ""


def test_a_shard_given_gpus_that_offloaded_no_layer_is_refused() -> None:
    output = "load_tensors: offloaded 0/31 layers to GPU\n"
    assert "offloaded no layer" in refusal(output, parse_compute(output), [1])
    fine = "load_tensors: offloaded 31/31 layers to GPU\n"
    assert refusal(fine, parse_compute(fine), [1]) == ""
