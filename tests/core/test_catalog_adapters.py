"""A model's LoRA adapters: checked field by field, for the model's engine and against the catalog."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.core.catalog import name_clashes, parse_model
from llmgw.errors import ValidationFailed

SHA = "0123456789abcdef" * 4
OTHER = "fedcba9876543210" * 4
PEFT_CONFIG = {"sha256": OTHER, "filename": "adapter_config.json"}


def vllm_model(*adapters: dict[str, Any], **profile: Any) -> dict[str, Any]:
    return {
        "name": "base",
        "source": {"sha256": SHA, "format": "safetensors"},
        "profile": {"engine": "vllm", **profile},
        "adapters": list(adapters),
    }


def gguf_model(*adapters: dict[str, Any]) -> dict[str, Any]:
    return {"name": "small", "source": {"sha256": SHA}, "adapters": list(adapters)}


def peft(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "sha256": SHA, "files": [PEFT_CONFIG], **fields}


def problems(data: Any) -> dict[str, str]:
    with pytest.raises(ValidationFailed) as caught:
        parse_model(data)
    return dict(caught.value.problems)


def test_a_peft_adapter_gets_vllms_file_name_and_the_largest_rank_counts() -> None:
    model = parse_model(vllm_model(peft("sql", rank=8), peft("chat", rank=64)))
    assert [a.name for a in model.adapters] == ["sql", "chat"]
    assert model.adapters[0].weights_filename("vllm") == "adapter_model.safetensors"
    assert model.max_lora_rank() == 64


def test_a_gguf_adapter_gets_llamacpps_file_name_and_keeps_its_scale() -> None:
    model = parse_model(gguf_model({"name": "tone", "sha256": SHA, "scale": 0.25}))
    assert model.adapters[0].weights_filename("llama.cpp") == "adapter.gguf"
    assert model.adapters[0].scale == 0.25 and model.max_lora_rank() == 0


def test_adapter_sizes_count_towards_the_memory_a_replica_needs() -> None:
    bare = parse_model(gguf_model())
    carrying = parse_model(gguf_model({"name": "tone", "sha256": SHA, "size": 400 * 2**20}))
    assert carrying.memory_needed_mb() - bare.memory_needed_mb() == 500


def test_an_adapter_named_like_no_openai_model_is_named() -> None:
    assert (
        "must start with a letter or digit"
        in problems(gguf_model({"name": "-x", "sha256": SHA}))["adapters.0.name"]
    )


def test_an_adapters_bad_sha256_and_scale_are_named() -> None:
    found = problems(gguf_model({"name": "tone", "sha256": "abc", "scale": float("inf")}))
    assert "64 hexadecimal digits" in found["adapters.0.sha256"]
    assert "between -100 and 100" in found["adapters.0.scale"]


def test_two_adapters_of_one_name_or_the_models_own_name_are_refused() -> None:
    found = problems(vllm_model(peft("sql"), peft("sql"), peft("base")))
    assert "two adapters are called 'sql'" in found["adapters.1.name"]
    assert "the model's own name" in found["adapters.2.name"]


def test_a_peft_adapter_needs_its_config_and_takes_no_scale() -> None:
    found = problems(vllm_model({"name": "sql", "sha256": SHA, "scale": 0.5}))
    assert "adapter_config.json" in found["adapters.0.files"]
    assert "scale is for engine llama.cpp" in found["adapters.0.scale"]


def test_a_gguf_file_on_vllm_is_refused_with_the_engine_that_takes_it() -> None:
    found = problems(vllm_model(peft("sql", filename="sql.gguf")))
    assert "engine llama.cpp" in found["adapters.0.filename"]


def test_a_llamacpp_adapter_is_one_gguf_file_without_a_rank() -> None:
    found = problems(
        gguf_model({"name": "t", "sha256": SHA, "filename": "t.bin", "files": [PEFT_CONFIG], "rank": 8})
    )
    assert "*.gguf" in found["adapters.0.filename"]
    assert "remove files" in found["adapters.0.files"]
    assert "rank is for engine vllm" in found["adapters.0.rank"]


@pytest.mark.parametrize("filename", ["a,b.gguf", "a:b.gguf"])
def test_a_llamacpp_adapter_file_name_that_would_split_its_flag_is_refused(filename: str) -> None:
    found = problems(gguf_model({"name": "t", "sha256": SHA, "filename": filename}))
    assert "rename the file" in found["adapters.0.filename"]


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_engines_without_lora_refuse_adapters(engine: str) -> None:
    found = problems(vllm_model(peft("sql"), engine=engine))
    assert found == {"adapters.0": f"engine {engine} serves no LoRA adapters; use engine llama.cpp or vllm"}


def test_an_adapter_named_like_another_model_or_its_adapter_clashes() -> None:
    existing = parse_model({**gguf_model({"name": "tone", "sha256": SHA}), "name": "other"})
    new = parse_model(vllm_model(peft("other"), peft("tone"), peft("fresh")))
    found = dict(name_clashes(new, [existing]))
    assert found == {
        "adapters.0.name": "is already the name of model 'other'; choose another name",
        "adapters.1.name": "is already the name of an adapter of model 'other'; choose another name",
    }


def test_a_model_named_like_an_existing_adapter_clashes_but_its_own_old_definition_does_not() -> None:
    existing = parse_model({**gguf_model({"name": "base", "sha256": SHA}), "name": "other"})
    assert dict(name_clashes(parse_model(vllm_model()), [existing]))["name"].startswith(
        "is already the name of an adapter of model 'other'"
    )
    assert name_clashes(existing, [existing]) == []
