"""The trainer: trains a LoRA adapter with peft, run by the agent INSIDE the training environment.

This file is run by path (``<training venv>/bin/python trainer.py ...``): it
imports only the standard library and the environment's packages (torch,
transformers, peft, safetensors), never the rest of llmgw. Its interface is
its command line and the JSON lines it prints on stdout, one object a line::

    {"event": "progress", "step": 3, "steps": 30, "loss": 2.41, "peak_memory_bytes": 812345344}
    {"event": "converting"}
    {"event": "result", "files": ["adapter_config.json", "adapter_model.safetensors", "adapter.gguf"]}

Anything else it (or a library) prints is a log line. It exits 0 once the
result is written, non-zero with the reason on its output otherwise.

The pairs file holds JSON lines ``{"question": ..., "answer": ...}``. Each pair
is rendered with the base model's chat template (the question as the user's
turn, the answer as the assistant's); the loss is taken on the answer's
tokens only (the prompt's labels are masked).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

DEFAULTS: dict[str, Any] = {
    "rank": 8,
    "alpha": 16,
    "dropout": 0.05,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "steps": 100,
    "learning_rate": 2e-4,
    "seed": 0,
    "max_length": 512,
}
"""The options a job may set (StartTraining.options), and their defaults."""

GGUF_ADAPTER = "adapter.gguf"


def say(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def options_of(text: str) -> dict[str, Any]:
    given = json.loads(text or "{}")
    if not isinstance(given, dict):
        raise SystemExit(f"options must be a JSON object, not {text!r}")
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise SystemExit(
            f"unknown training options {', '.join(unknown)}; the options are {', '.join(DEFAULTS)}"
        )
    return {**DEFAULTS, **given}


def read_pairs(path: Path) -> list[tuple[str, str]]:
    pairs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        if not isinstance(record, dict) or not record.get("question") or not record.get("answer"):
            raise SystemExit(f'pair {number} is not {{"question": ..., "answer": ...}}: {line[:200]}')
        pairs.append((str(record["question"]), str(record["answer"])))
    if not pairs:
        raise SystemExit("the job has no question/answer pairs to train on")
    return pairs


def encode(tokenizer: Any, question: str, answer: str, max_length: int) -> tuple[list[int], list[int]]:
    """The pair's token ids and its labels: -100 (ignored) over the prompt, the ids over the answer."""
    user = [{"role": "user", "content": question}]
    prompt = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=True)
    whole = tokenizer.apply_chat_template([*user, {"role": "assistant", "content": answer}], tokenize=True)
    if whole[: len(prompt)] != prompt:  # a template that renders the prompt otherwise once answered
        whole = prompt + tokenizer(answer, add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            whole.append(tokenizer.eos_token_id)
    ids = whole[:max_length]
    labels = [-100] * min(len(prompt), len(ids)) + ids[len(prompt) :]
    return ids, labels


def peak_memory(torch: Any, device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def train(args: argparse.Namespace) -> list[str]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    options = options_of(args.options)
    pairs = read_pairs(Path(args.pairs))
    torch.manual_seed(int(options["seed"]))
    device = "cuda" if args.device == "cuda" else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "the job was given a card, but torch sees no CUDA device (CUDA_VISIBLE_DEVICES, driver)"
        )
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.base, dtype=dtype).to(device)
    lora = LoraConfig(
        r=int(options["rank"]),
        lora_alpha=int(options["alpha"]),
        lora_dropout=float(options["dropout"]),
        target_modules=list(options["target_modules"]),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    encoded = [encode(tokenizer, q, a, int(options["max_length"])) for q, a in pairs]
    width = max(len(ids) for ids, _ in encoded)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in encoded], device=device)
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in encoded], device=device)
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in encoded], device=device)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=float(options["learning_rate"])
    )
    steps = int(options["steps"])
    model.train()
    for step in range(1, steps + 1):
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        say(
            event="progress",
            step=step,
            steps=steps,
            loss=float(loss.item()),
            peak_memory_bytes=peak_memory(torch, device),
        )
    out = Path(args.out)
    model.save_pretrained(out)
    files = ["adapter_config.json", "adapter_model.safetensors"]
    if args.convert_lora:
        say(event="converting")
        convert = [
            sys.executable, args.convert_lora, "--base", args.base, "--outtype", "f16",
            "--outfile", str(out / GGUF_ADAPTER), str(out),
        ]  # fmt: skip
        done = subprocess.run(convert, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in done.stdout.splitlines():
            print(line, flush=True)
        if done.returncode != 0:
            raise SystemExit(f"convert_lora_to_gguf.py failed with exit code {done.returncode}")
        files.append(GGUF_ADAPTER)
    return files


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train a LoRA adapter (run by the llmgw agent).")
    parser.add_argument(
        "--base", required=True, help="the base model's folder (safetensors, config, tokenizer)"
    )
    parser.add_argument("--pairs", required=True, help="JSON lines of question/answer pairs")
    parser.add_argument("--options", default="{}", help="JSON: " + ", ".join(DEFAULTS))
    parser.add_argument("--out", required=True, help="where the adapter's files go")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--convert-lora", default="", help="llama.cpp's convert_lora_to_gguf.py: also make a GGUF"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    files = train(args)
    say(event="result", files=files)


if __name__ == "__main__":
    main()
