"""Publishing a trained adapter: the architecture check, and the catalog adapter it becomes.

``ctl train publish JOB --name NAME`` makes the job's results an adapter of
its base model, owned by the job's owner (or one given). Before that,
:func:`architecture_problems` reads the ``adapter_config.json`` the job made
and the base model's ``config.json``: a PEFT LoRA, for that base, of the
job's rank (at most the model's hidden size), on modules the architecture
has. A mismatch is refused naming what differs. The adapter is the GGUF file
when the model is served by llama.cpp, else the PEFT folder
(``adapter_model.safetensors`` beside ``adapter_config.json``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from llmgw.core.catalog import PEFT_CONFIG, Adapter, ModelDefinition, SourceFile
from llmgw.core.engines import AdapterShape
from llmgw.core.tenancy import Owner
from llmgw.errors import ValidationFailed

LLAMA_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
MODULES: Mapping[str, frozenset[str]] = {
    **{
        kind: LLAMA_MODULES
        for kind in ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3")
    },
    "phi3": frozenset({"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}),
    "gpt2": frozenset({"c_attn", "c_proj", "c_fc"}),
}
"""The linear modules a LoRA may target, by the base config's ``model_type``; another type is not checked."""


def read_json(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValidationFailed([(what, f"is not JSON ({error})")], "train the job again") from None
    if not isinstance(value, dict):
        raise ValidationFailed([(what, "is not a JSON object")], "train the job again")
    return value


def architecture_problems(
    adapter_config: Mapping[str, Any], base_config: Mapping[str, Any], model: str, rank: int
) -> list[tuple[str, str]]:
    """What in the adapter does not fit the base model (``(field, why)``; empty: it fits)."""
    problems: list[tuple[str, str]] = []
    at = PEFT_CONFIG
    peft_type = str(adapter_config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        problems.append((f"{at}.peft_type", f"is {peft_type}; only LoRA adapters are served"))
    base = str(adapter_config.get("base_model_name_or_path") or "")
    known = {model, str(base_config.get("_name_or_path") or "")} - {""}
    if base and not base.startswith(("/", ".")) and base not in known:
        problems.append((f"{at}.base_model_name_or_path", f"is {base!r}, not the model {model!r}"))
    r = adapter_config.get("r")
    hidden = base_config.get("hidden_size")
    if not isinstance(r, int) or r < 1:
        problems.append((f"{at}.r", f"is {r!r}, not a rank"))
    else:
        if r != rank:
            problems.append((f"{at}.r", f"is {r}, the job trained rank {rank}"))
        if isinstance(hidden, int) and r > hidden:
            problems.append((f"{at}.r", f"is {r}, above the model's hidden_size {hidden}"))
    targets = adapter_config.get("target_modules")
    names = [targets] if isinstance(targets, str) else list(targets or [])
    if not names:
        problems.append((f"{at}.target_modules", "names no module"))
    modules = MODULES.get(str(base_config.get("model_type", "")))
    if modules is not None:
        stray = sorted(set(map(str, names)) - modules)
        if stray:
            problems.append(
                (
                    f"{at}.target_modules",
                    f"{', '.join(stray)} not in a {base_config.get('model_type')} model "
                    f"(it has {', '.join(sorted(modules))})",
                )
            )
    return problems


def adapter_shape(model: ModelDefinition) -> AdapterShape:
    """How the model's engine takes adapters (the first profile's engine: every profile's is the same)."""
    return model.profile.capabilities.adapter_shape


def published_adapter(
    model: ModelDefinition, results: Sequence[Mapping[str, Any]], name: str, owner: Owner, rank: int
) -> Adapter:
    """The catalog adapter a job's ``results`` become on ``model``: refused when the engine serves none
    or the job did not make the file the engine reads."""
    shape = adapter_shape(model)
    files = {str(r["filename"]): r for r in results}
    if shape is AdapterShape.GGUF_FILE:
        wanted = [n for n in files if n.endswith(".gguf")]
        if not wanted:
            raise ValidationFailed(
                [("results", f"no GGUF adapter among {', '.join(sorted(files)) or 'the results'}")],
                f"{model.name} is served by llama.cpp: train again with --gguf",
            )
        weights, others = files[wanted[0]], []
    elif shape is AdapterShape.PEFT_FOLDER:
        if "adapter_model.safetensors" not in files or PEFT_CONFIG not in files:
            raise ValidationFailed(
                [("results", f"the job made no adapter_model.safetensors and {PEFT_CONFIG}")],
                "train the job again",
            )
        weights, others = files["adapter_model.safetensors"], [files[PEFT_CONFIG]]
    else:
        raise ValidationFailed(
            [("model", f"{model.name}'s engine {model.profile.engine} serves no LoRA adapters")],
            "publish onto a model served by llama.cpp or vLLM",
        )
    caps = model.profile.capabilities
    return Adapter(
        name=name,
        sha256=str(weights["sha256"]),
        filename=str(weights["filename"]),
        size=int(weights["size"]),
        files=tuple(
            SourceFile(sha256=str(f["sha256"]), filename=str(f["filename"]), size=int(f["size"]))
            for f in others
        ),
        rank=rank if caps.adapter_ranks else None,
        owner=str(owner),
    )


def with_adapter(definition: Mapping[str, Any], adapter: Adapter) -> dict[str, Any]:
    """``definition`` with ``adapter`` added (its name checked against the catalog's by the caller)."""
    return {**definition, "adapters": [*definition.get("adapters", []), adapter.model_dump(mode="json")]}
