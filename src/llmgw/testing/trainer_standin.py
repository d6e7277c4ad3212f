"""A stand-in for the trainer (:mod:`llmgw.training.trainer`) at the agent's subprocess seam.

Run by path like the real one, with the same command line and JSON-lines
output, it trains nothing. ``--options`` (JSON) says what it does:
``steps`` (progress lines, loss falling), ``hang`` (after its first line, wait
until it is signalled), ``fail`` (exit 3 after a few log lines, no result).
It prints its pid and what it was given (device, ``CUDA_VISIBLE_DEVICES``)
as log lines, and writes the PEFT files (and ``adapter.gguf`` when given
``--convert-lora``) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--base", "--pairs", "--out"):
        parser.add_argument(name, required=True)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--convert-lora", default="")
    args = parser.parse_args()
    options = json.loads(args.options)
    print(f"pid {os.getpid()} device {args.device} visible {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}")
    print(f"pairs {len(Path(args.pairs).read_text().splitlines())}", flush=True)
    if options.get("hang"):
        while True:
            signal.pause()  # until SIGTERM ends it
    if options.get("fail"):
        for line in range(30):
            print(f"warming up {line}")
        print("RuntimeError: out of memory", flush=True)
        sys.exit(3)
    steps = int(options.get("steps", 3))
    for step in range(1, steps + 1):
        say(event="progress", step=step, steps=steps, loss=4.0 / step, peak_memory_bytes=1000 * step)
    out = Path(args.out)
    (out / "adapter_config.json").write_text(json.dumps({"r": 8, "base": args.base}))
    (out / "adapter_model.safetensors").write_bytes(bytes(range(256)) * int(options.get("kib", 1)) * 4)
    files = ["adapter_config.json", "adapter_model.safetensors"]
    if args.convert_lora:
        say(event="converting")
        (out / "adapter.gguf").write_bytes(b"GGUF" + b"\0" * 60)
        files.append("adapter.gguf")
    say(event="result", files=files)


if __name__ == "__main__":
    main()
