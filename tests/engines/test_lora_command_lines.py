"""LoRA adapters on the engines' command lines: vLLM's --lora-modules and limits, llama.cpp's --lora."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.engines import llamacpp, vllm
from llmgw.engines.engine import Launch, LaunchAdapter

SQL = LaunchAdapter("sql", Path("/w/weights/aa/"))
CHAT = LaunchAdapter("chat", Path("/w/weights/bb"))


def launch(**changes: object) -> Launch:
    base: dict[str, object] = {
        "weights": Path("/w/m"),
        "port": 21001,
        "api_key": "sk-replica",
        "model": "base",
        "key_file": Path("/w/shards/r1/api-key"),
    }
    return Launch(**(base | changes))  # type: ignore[arg-type]


def after(argv: list[str], name: str, count: int = 1) -> list[str]:
    start = argv.index(name) + 1
    return argv[start : start + count]


def test_vllm_registers_every_adapter_at_start_and_lets_a_batch_mix_them_all() -> None:
    spec = launch(adapters=(SQL, CHAT), max_lora_rank=32)
    argv = vllm.ENGINE.command_line(Path("vllm"), spec)
    assert "--enable-lora" in argv
    assert after(argv, "--lora-modules", 2) == ["sql=/w/weights/aa", "chat=/w/weights/bb"]
    assert after(argv, "--max-loras") == ["2"]
    assert after(argv, "--max-lora-rank") == ["32"]
    # no runtime loading: the adapters are fixed
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in vllm.ENGINE.environment(spec)


def test_vllm_with_runtime_adapters_gets_slots_but_no_modules() -> None:
    argv = vllm.ENGINE.command_line(
        Path("vllm"), launch(max_loaded_adapters=2, adapters=(SQL,), max_lora_rank=8)
    )
    assert "--lora-modules" not in argv
    assert after(argv, "--max-loras") == ["2"] and after(argv, "--max-lora-rank") == ["8"]
    assert argv.count("--enable-lora") == 1


@pytest.mark.parametrize(("rank", "flag"), [(4, "8"), (8, "8"), (9, "16"), (300, "320"), (512, "512")])
def test_vllm_gets_the_smallest_max_lora_rank_it_takes_that_holds_the_adapters(rank: int, flag: str) -> None:
    argv = vllm.ENGINE.command_line(Path("vllm"), launch(adapters=(SQL,), max_lora_rank=rank))
    assert after(argv, "--max-lora-rank") == [flag]


def test_vllm_without_adapters_gets_no_rank() -> None:
    argv = vllm.ENGINE.command_line(Path("vllm"), launch(max_lora_rank=8))
    assert "--max-lora-rank" not in argv and "--enable-lora" not in argv


def test_vllm_keeps_the_engines_default_rank_when_no_adapter_declares_one() -> None:
    argv = vllm.ENGINE.command_line(Path("vllm"), launch(adapters=(SQL,)))
    assert "--max-lora-rank" not in argv


def test_llamacpp_loads_each_adapter_fully_or_at_its_scale() -> None:
    half = LaunchAdapter("half", Path("/w/weights/cc/half.gguf"), 0.5)
    full = LaunchAdapter("full", Path("/w/weights/dd/full.gguf"))
    argv = llamacpp.ENGINE.command_line(Path("llama-server"), launch(adapters=(half, full)))
    assert after(argv, "--lora-scaled") == ["/w/weights/cc/half.gguf:0.5"]
    assert after(argv, "--lora") == ["/w/weights/dd/full.gguf"]


def test_llamacpp_without_adapters_loads_none() -> None:
    argv = llamacpp.ENGINE.command_line(Path("llama-server"), launch())
    assert not {"--lora", "--lora-scaled"} & set(argv)
