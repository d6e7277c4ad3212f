"""Proving an engine build computes: at install (C4.2) and with ``llmgw ctl engine-check`` (C4.4).

Seeing a device is not computing on it. For llama.cpp the check starts the
build on a small GGUF with every layer asked onto the GPU (``-ngl 99``) at
verbosity 4 (``-lv 4``, where llama.cpp says where its layers went), asks
for one token, and reads the start-up output: a build that computes on the
CPU on a machine with NVIDIA GPUs fails, naming the fix. On a machine
without GPUs it proves the CPU build answers a token. At install the GGUF is
llmgw's own check model (:mod:`llmgw.engines.checkmodel`), written on the
node, so no model needs to be there first (measured here: the CPU build of
llama.cpp answers in 0.3 to 0.6 s).

vLLM and SGLang are checked in their build's own Python
(:mod:`llmgw.engines.pythonchecks`). For TensorRT-LLM the check asks whether the operator's Python
(``engines.trtllm.python``) imports ``tensorrt_llm`` and has
``trtllm-serve`` beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from llmgw.engines import checkmodel, llamacpp
from llmgw.engines.buildverdicts import CheckResult, NodeConditions
from llmgw.engines.engine import Compute
from llmgw.engines.trtllm import serve_program

NO_USABLE_GPU = "no usable GPU found"
CUDA_BUILD_FIX = (
    "install a CUDA build of llama.cpp: run 'llmgw engine install' on this machine with the NVIDIA "
    "driver loaded ('nvidia-smi' answers), or pass --bin with a CUDA build's llama-server"
)

OUT_OF_MEMORY = re.compile(r"out of memory|OutOfDeviceMemory", re.IGNORECASE)
"""What llama.cpp prints when a card has no memory left for it (CUDA's and Vulkan's errors)."""
FULL_CARD_FIX = (
    "free some memory on the node's cards (stop a replica or the process holding it) and install "
    "again; a full card says nothing about the build, so nothing was recorded"
)
INSTALL_CHECK_TIMEOUT_S = 300.0
"""How long a build may take to answer its check at install (a CUDA build for a card it ships only
as PTX compiles its kernels on first use)."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def llamacpp_command(binary: Path, model: Path, port: int, *, gpu: bool) -> list[str]:
    """llama-server on the loopback with a small context; every layer on the GPU when ``gpu``."""
    argv = [
        str(binary),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        "512",
        "-np",
        "1",
    ]
    if gpu:
        argv += ["-ngl", "99", "-lv", "4"]
    return argv


def llamacpp_verdict(output: str, *, gpu: bool, answered: bool, variant: str = "") -> CheckResult:
    """Read where the token was computed from llama-server's output."""
    if not answered:
        tail = " | ".join(output.strip().splitlines()[-3:])
        if gpu and (full := OUT_OF_MEMORY.search(output)):
            line = next(x for x in output.splitlines() if full[0] in x).strip()
            return CheckResult(False, f"the card had no memory left for the check: {line}", FULL_CARD_FIX,
                               conclusive=False)  # fmt: skip
        return CheckResult(
            False,
            f"llama-server did not answer a token: {tail or 'no output'}",
            "check the build runs ('llama-server --version') and reinstall it with 'llmgw engine install'",
        )
    compute: Compute = llamacpp.parse_compute(output)
    if not gpu:
        return CheckResult(True, "a token computed on the CPU (this machine has no NVIDIA GPU)")
    if compute.all_on_gpu:
        where = ",".join(compute.devices)
        layers = (
            f", {compute.layers_offloaded} of {compute.layers_total} layers offloaded"
            if compute.layers_total is not None
            else ""
        )
        return CheckResult(True, f"a token computed on {where}{layers}")
    if NO_USABLE_GPU in output:
        why = "the build found no usable GPU"
    elif compute.layers_total is not None:
        why = f"only {compute.layers_offloaded} of {compute.layers_total} layers went to the GPU"
    else:
        why = "the build named no GPU it computes on"
    build = f" (build {variant})" if variant else ""
    return CheckResult(False, f"a token computed on the CPU{build}: {why}", CUDA_BUILD_FIX)


async def check_llamacpp(
    binary: Path, model: Path, *, gpu: bool, variant: str = "", timeout_s: float = 120.0
) -> CheckResult:
    """Start the build on ``model``, ask one token, and judge where it computed."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="llmgw-engine-check-") as work:
        output_path = Path(work) / "output.log"
        descriptor = os.open(output_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            process = await asyncio.create_subprocess_exec(
                *llamacpp_command(binary, model, port, gpu=gpu),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=descriptor,
                stderr=descriptor,
                cwd=work,
            )
        except OSError as error:
            return CheckResult(
                False, f"cannot start {binary}: {error.strerror}", "pass --bin with a llama-server"
            )
        finally:
            os.close(descriptor)
        try:
            answered = await _one_token(process, f"http://127.0.0.1:{port}", timeout_s)
        finally:
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    process.kill()
                    await process.wait()
        output = output_path.read_text(errors="replace")
    return llamacpp_verdict(output, gpu=gpu, answered=answered, variant=variant)


@dataclass(frozen=True)
class LlamaCppBuildCheck:
    """llama.cpp's check at install: the build loads llmgw's check model with every layer on the card
    and answers a token (:func:`check_llamacpp`); on a node without NVIDIA cards it answers a token."""

    node: NodeConditions
    timeout_s: float = INSTALL_CHECK_TIMEOUT_S

    async def __call__(self, program: Path, variant: str) -> CheckResult:
        with tempfile.TemporaryDirectory(prefix="llmgw-build-check-") as work:
            model = await asyncio.to_thread(checkmodel.write_check_model, Path(work))
            return await check_llamacpp(
                program, model, gpu=self.node.gpu, variant=variant, timeout_s=self.timeout_s
            )


async def _one_token(process: asyncio.subprocess.Process, base: str, timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while process.returncode is None and loop.time() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with session.get(base + "/health") as response:
                    if response.status == 200:
                        break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 0.25)
        else:
            return False
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with session.post(
                base + "/completion", json={"prompt": "Hello", "n_predict": 1}
            ) as response:
                body = await response.json(content_type=None)
                return response.status == 200 and int(body.get("tokens_predicted", 0)) >= 1
    return False


async def run_command(argv: list[str], timeout_s: float) -> tuple[int, str]:
    """``argv``'s exit status and output (stdout and stderr); -1 when it cannot start or times out."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as error:
        return -1, f"cannot run {argv[0]}: {error.strerror}"
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        return -1, f"{argv[0]} did not finish within {timeout_s:.0f} s"
    return process.returncode or 0, output.decode(errors="replace").strip()


async def check_trtllm(python: Path | None, timeout_s: float = 120.0) -> CheckResult:
    """The operator's TensorRT-LLM: a Python that imports it, with ``trtllm-serve`` beside it."""
    if python is None:
        return CheckResult(
            False,
            "engines.trtllm.python is not set in agent.yaml",
            "install TensorRT-LLM into a Python environment and name that Python in engines.trtllm.python",
        )
    code, output = await run_command(
        [str(python), "-c", "import tensorrt_llm; print(tensorrt_llm.__version__)"], timeout_s
    )
    if code != 0:
        return CheckResult(
            False,
            f"{python} cannot import tensorrt_llm: {output.splitlines()[-1] if output else code}",
            "install TensorRT-LLM into that environment (pip install tensorrt-llm), or name the Python "
            "that has it in engines.trtllm.python",
        )
    serve = serve_program(Path(python))
    if not os.access(serve, os.X_OK):
        return CheckResult(
            False,
            f"TensorRT-LLM {output.splitlines()[-1]} has no trtllm-serve at {serve}",
            "reinstall TensorRT-LLM there so its trtllm-serve sits beside the Python",
        )
    return CheckResult(True, f"TensorRT-LLM {output.splitlines()[-1]} with trtllm-serve at {serve}")
