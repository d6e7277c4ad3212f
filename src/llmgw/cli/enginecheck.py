"""``llmgw ctl engine-check``: prove an engine build computes where it should, on this machine.

The command's options; what it runs is :mod:`llmgw.cli.enginechecking`,
imported when it runs (it loads the agent's and the engines' modules, which
the rest of ``ctl`` does without).
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from llmgw.core.engines import DEFAULT_ENGINE, ENGINE_NAMES, either

DEFAULT_CACHE = Path(os.environ.get("LLMGW_CACHE", "~/.cache/llmgw"))


def engine_check(
    engine: str = typer.Argument(DEFAULT_ENGINE, help=f"{either(ENGINE_NAMES)}."),
    binary: Path | None = typer.Option(
        None, "--bin", help="The build to check (llama-server, vllm, or the Python of SGLang/TensorRT-LLM)."
    ),
    model: Path | None = typer.Option(
        None,
        "--model",
        help="A small GGUF for llama.cpp to load (default: the bundled SmolLM2, else llmgw's check model).",
    ),
    config: Path | None = typer.Option(
        None, "--config", help="agent.yaml, for the engines it names (engines.trtllm.python and others)."
    ),
    cache_dir: Path = typer.Option(DEFAULT_CACHE, "--cache-dir", help="Where the agent installs builds."),
    nvidia_smi: str = typer.Option("nvidia-smi", help="nvidia-smi to find the cards with."),
    proc_version: Path = typer.Option(
        Path("/proc/driver/nvidia/version"), help="The NVIDIA kernel module's version file.", hidden=True
    ),
    timeout_s: float = typer.Option(120.0, "--timeout", help="Seconds the build may take to answer."),
    as_json: bool = typer.Option(False, "--json", help="Print the result and the verdicts as JSON."),
) -> None:
    """Prove an engine build computes: llama.cpp answers a token with every layer on the GPU.

    On a machine without NVIDIA GPUs llama.cpp's CPU build must answer a token. vLLM and SGLang must
    import their compiled extension with torch seeing the card (vLLM's CPU build: run one of its CPU
    kernels). Shows the builds accepted on this machine and every one refused, with why. Exits 1 naming
    the fix when the build does not compute where it should.
    """
    from llmgw.cli.enginechecking import run_check

    run_check(engine, binary, model, config, cache_dir, nvidia_smi, proc_version, timeout_s, as_json)
