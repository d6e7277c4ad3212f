"""The architecture check: an adapter that does not fit its base model is refused naming what differs."""

from __future__ import annotations

from llmgw.training.publishing import architecture_problems

BASE = {"model_type": "llama", "hidden_size": 64, "_name_or_path": "meta/tiny"}
FITS = {
    "peft_type": "LORA",
    "r": 8,
    "target_modules": ["q_proj", "v_proj"],
    "base_model_name_or_path": "meta/tiny",
}


def test_an_adapter_of_the_jobs_rank_on_the_models_modules_fits() -> None:
    assert architecture_problems(FITS, BASE, "tiny", 8) == []
    assert architecture_problems({**FITS, "base_model_name_or_path": "/var/lib/base"}, BASE, "tiny", 8) == []
    unknown_type = {**BASE, "model_type": "mamba"}
    assert architecture_problems({**FITS, "target_modules": ["in_proj"]}, unknown_type, "tiny", 8) == []


def test_each_difference_is_named() -> None:
    adapter = {"peft_type": "IA3", "r": 128, "target_modules": "c_attn", "base_model_name_or_path": "gpt2"}
    found = dict(architecture_problems(adapter, BASE, "tiny", 8))
    assert found == {
        "adapter_config.json.peft_type": "is IA3; only LoRA adapters are served",
        "adapter_config.json.base_model_name_or_path": "is 'gpt2', not the model 'tiny'",
        "adapter_config.json.r": "is 128, above the model's hidden_size 64",
        "adapter_config.json.target_modules": "c_attn not in a llama model "
        "(it has down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj)",
    }
