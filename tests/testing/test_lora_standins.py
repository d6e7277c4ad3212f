"""The stand-ins take LoRA adapters as their engines do: vLLM's --lora-modules, llama-server's --lora."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.testing import llama_server_standin, vllm_standin
from llmgw.testing.engine_standin import peft_refusal


def peft_folder(root: Path, *files: str) -> Path:
    root.mkdir(parents=True)
    for name in files:
        (root / name).write_text("{}")
    return root


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("sql=/w/aa", ("sql", "/w/aa")),
        ('{"name": "sql", "path": "/w/aa", "base_model_name": "m"}', ("sql", "/w/aa")),
    ],
    ids=["name=path", "json"],
)
def test_a_lora_module_reads_in_both_of_vllms_forms(value: str, expected: tuple[str, str]) -> None:
    assert vllm_standin.lora_module(value) == expected


def test_a_peft_folder_needs_its_config_and_weights(tmp_path: Path) -> None:
    assert peft_refusal(str(tmp_path / "nowhere")).endswith("not a folder")
    assert "adapter_config.json" in peft_refusal(
        str(peft_folder(tmp_path / "a", "adapter_model.safetensors"))
    )
    assert "adapter_model" in peft_refusal(str(peft_folder(tmp_path / "b", "adapter_config.json")))
    assert (
        peft_refusal(str(peft_folder(tmp_path / "c", "adapter_config.json", "adapter_model.safetensors")))
        == ""
    )


def test_vllm_refuses_to_start_with_a_module_that_is_no_adapter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = vllm_standin.main(["serve", "m", "--enable-lora", "--lora-modules", f"sql={tmp_path / 'gone'}"])
    assert code == 1 and "cannot load LoRA module" in capsys.readouterr().err


def test_vllm_refuses_modules_without_lora_turned_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert vllm_standin.main(["serve", "m", "--lora-modules", f"sql={tmp_path}"]) == 2
    assert "needs --enable-lora" in capsys.readouterr().err


def test_llama_server_loads_each_lora_file_at_its_scale(tmp_path: Path) -> None:
    files = [tmp_path / name for name in ("a.gguf", "b.gguf", "c.gguf")]
    for file in files:
        file.write_bytes(b"GGUF")
    args = llama_server_standin.parse_args(
        ["--lora", str(files[0]), "--lora-scaled", f"{files[2]}:0.25", "--lora", str(files[1])]
    )
    server = llama_server_standin.StandIn("k", "m", 0, args.loras)
    assert server.adapters() == [  # ids in command-line order, as llama-server numbers them
        {"id": 0, "path": str(files[0]), "scale": 1.0},
        {"id": 1, "path": str(files[2]), "scale": 0.25},
        {"id": 2, "path": str(files[1]), "scale": 1.0},
    ]


def test_llama_server_takes_comma_separated_lists(tmp_path: Path) -> None:
    files = [tmp_path / name for name in ("a.gguf", "b.gguf")]
    for file in files:
        file.write_bytes(b"GGUF")
    args = llama_server_standin.parse_args(["--lora-scaled", f"{files[0]}:0.5,{files[1]}:2"])
    assert args.loras == [(str(files[0]), 0.5), (str(files[1]), 2.0)]


def test_a_request_applies_the_adapters_it_names_and_no_others() -> None:
    server = llama_server_standin.StandIn("k", "m", 0, [("a.gguf", 0.5), ("b.gguf", 1.0)])
    server.applying(None)
    assert (server.last_scales, server.last_asked) == ([0.5, 1.0], [])  # no lora field: every adapter
    server.applying([{"id": 1, "scale": 0.75}])
    assert (server.last_scales, server.last_asked) == ([0.0, 0.75], [{"id": 1, "scale": 0.75}])


def test_llama_server_refuses_a_lora_file_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        llama_server_standin.parse_args(["--lora", str(tmp_path / "gone.gguf")])
