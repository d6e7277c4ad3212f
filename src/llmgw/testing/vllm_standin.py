"""A stand-in for vLLM's ``vllm`` command: ``vllm serve MODEL`` with vLLM's flags, on the timing model.

It parses the flags vLLM documents for ``vllm serve`` (underscores read as
dashes, as vLLM does), refuses unknown ones as argparse does (exit 2,
"unrecognized arguments"), and serves the OpenAI routes, ``/tokenize``,
``/metrics`` under vLLM's names (a request's ``cache_salt`` salting its prefix cache as vLLM does: the
first block's extra keys), the runtime LoRA routes (with
``--enable-lora``, ``--max-loras`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``)
and, with ``--kv-events-config``, KV-cache events over ZMQ with vLLM's
replay socket (:mod:`llmgw.testing.kv_events_publisher`;
``LLMGW_STANDIN_KV_LOSE`` names batches to lose on the way). Its key comes
from ``--api-key`` or else ``VLLM_API_KEY`` and guards the routes under
``/v1`` only, and it prints its "non-default args" at start, as vLLM does.
With ``--distributed-executor-backend ray`` it joins the Ray cluster at
``RAY_ADDRESS`` (:mod:`llmgw.testing.ray_standin`, or a real Ray's cluster where
``LLMGW_STANDIN_RAY`` names its ``ray``) and serves only once the cluster holds
tp x pp cards, exiting when it holds fewer again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from llmgw.testing import standin_rendezvous
from llmgw.testing.block_hashing import block_hash, none_hash
from llmgw.testing.engine_standin import StandinSettings, peft_refusal, serve

VERSION = "0.11.0"


def _tasks(runner: str, convert: str) -> frozenset[str]:
    """What the model serves: a pooling runner embeds (``--convert embed``) or scores pairs (a
    cross-encoder's head: rerank); anything else generates."""
    if runner != "pooling":
        return frozenset({"chat"})
    return frozenset({"embeddings"}) if convert == "embed" else frozenset({"rerank"})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm serve")
    add = parser.add_argument
    add("model_tag", nargs="?")
    add("--model")
    add("--host", default=None)
    add("--port", type=int, default=8000)
    add("--api-key")
    add("--served-model-name", nargs="+")
    add("--tensor-parallel-size", "-tp", type=int, default=1)
    add("--pipeline-parallel-size", "-pp", type=int, default=1)
    add("--data-parallel-size", "-dp", type=int, default=1)
    add("--distributed-executor-backend", choices=["ray", "mp", "uni", "external_launcher"])
    add("--max-model-len", type=int)
    add("--max-num-seqs", type=int, default=256)
    add("--max-num-batched-tokens", type=int)
    add("--block-size", type=int, default=16)
    add("--num-gpu-blocks-override", type=int)
    add("--gpu-memory-utilization", type=float, default=0.9)
    add("--swap-space", type=float)
    add("--dtype", default="auto")
    add("--kv-cache-dtype", default="auto")
    add("--quantization", "-q")
    add("--seed", type=int)
    add("--revision")
    add("--tokenizer")
    add("--trust-remote-code", action="store_true")
    add("--enforce-eager", action="store_true")
    add("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    add("--enable-chunked-prefill", action=argparse.BooleanOptionalAction)
    add("--prefix-caching-hash-algo", choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
    add("--runner", choices=["auto", "generate", "pooling", "draft"], default="auto")
    add("--convert", choices=["auto", "none", "embed", "classify", "reward"], default="auto")
    add("--enable-lora", action="store_true")
    add("--max-loras", type=int, default=1)
    add("--max-lora-rank", type=int, default=16, choices=[1, 8, 16, 32, 64, 128, 256, 320, 512])
    add("--max-cpu-loras", type=int)
    add("--lora-modules", nargs="+")
    add("--kv-events-config")
    add("--generation-config")
    add("--chat-template")
    add("--tool-call-parser")
    add("--enable-auto-tool-choice", action="store_true")
    add("--reasoning-parser")
    add("--disable-log-stats", action="store_true")
    add("--enable-log-requests", action="store_true")
    add("--uvicorn-log-level", default="info")
    add("--limit-mm-per-prompt")
    return parser


def lora_module(value: str) -> tuple[str, str]:
    """One ``--lora-modules`` value: ``name=path`` or JSON with ``name`` and ``path``."""
    if value.lstrip().startswith("{"):
        data = json.loads(value)
        return str(data.get("name", "")), str(data.get("path", ""))
    name, _, path = value.partition("=")
    return name, path


def _dashes(argv: list[str]) -> list[str]:
    """vLLM's parser reads ``--max_model_len`` as ``--max-model-len``."""
    out = []
    for token in argv:
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            token = name.replace("_", "-") + eq + value
        out.append(token)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--version"], ["-v"]):
        print(VERSION)
        return 0
    if argv[:1] != ["serve"]:
        print("usage: vllm {serve,chat,complete,bench,collect-env,run-batch} ...", file=sys.stderr)
        return 2
    parser = _parser()
    options = parser.parse_args(_dashes(argv[1:]))
    changed = {k: v for k, v in vars(options).items() if v != parser.get_default(k)}
    print(f"INFO: non-default args: {changed}", flush=True)  # as vllm serve logs them
    model = options.model_tag or options.model
    if not model:
        print("vllm serve: error: the model is missing (vllm serve MODEL)", file=sys.stderr)
        return 2
    platform = "cuda" if os.environ.get("CUDA_VISIBLE_DEVICES") else "cpu"
    print(f"INFO: Automatically detected platform {platform}.", flush=True)
    max_len = options.max_model_len or 4096
    settings = StandinSettings(
        engine="vllm",
        served_name=(options.served_model_name or [model])[0],
        host=options.host or "0.0.0.0",
        port=options.port,
        api_key=options.api_key or os.environ.get("VLLM_API_KEY", ""),
        max_running=options.max_num_seqs,
        max_model_len=max_len,
        block_size=options.block_size,
        num_blocks=options.num_gpu_blocks_override or max(64, 4 * max_len // options.block_size),
        max_loras=options.max_loras if options.enable_lora else 0,
        runtime_lora=options.enable_lora
        and os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"),
        lora_paths_checked=True,
        tasks=_tasks(options.runner, options.convert),
    )
    if options.lora_modules:
        if not options.enable_lora:
            print("vllm serve: error: --lora-modules needs --enable-lora", file=sys.stderr)
            return 2
        for module in options.lora_modules:
            name, path = lora_module(module)
            refusal = peft_refusal(path) if name and path else "the format is name=path"
            if refusal:
                print(f"ValueError: cannot load LoRA module {module!r}: {refusal}", file=sys.stderr)
                return 1
            settings.static_loras[name] = path
    if options.prefix_caching_hash_algo == "sha256_cbor":
        root = none_hash()
        settings.hash_block = lambda parent, tokens: block_hash(parent, tokens, root)
        settings.hash_salted = lambda tokens, salt: block_hash(None, tokens, root, (("cache_salt", salt),))
    publisher = None
    if options.kv_events_config:
        config = json.loads(options.kv_events_config)
        if config.get("enable_kv_cache_events"):
            from llmgw.testing.kv_events_publisher import attach

            publisher = config
    if options.distributed_executor_backend == "ray":
        address = os.environ.get("RAY_ADDRESS", "")
        if not address:
            print("RuntimeError: no Ray cluster to join (RAY_ADDRESS is not set)", file=sys.stderr)
            return 1
        needed = options.tensor_parallel_size * options.pipeline_parallel_size
        what = f"vllm (placement group of {needed} GPU(s))"
        real_ray = os.environ.get(standin_rendezvous.REAL_RAY, "")
        if real_ray:
            standin_rendezvous.wait_real_ray(real_ray, address, needed, what)
        else:
            standin_rendezvous.wait(address, needed, what)
    serve(settings, on_start=(lambda standin: attach(standin, publisher)) if publisher else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
