"""Proving an engine build computes (``llmgw ctl engine-check``).

Seeing a device is not computing on it. For llama.cpp the check starts the
build on a small GGUF with every layer asked onto the GPU (``-ngl 99``) at
verbosity 4 (``-lv 4``, where llama.cpp says where its layers went), asks
for one token, and reads the start-up output: a build that computes on the
CPU on a machine with NVIDIA GPUs fails, naming the fix. On a machine
without GPUs it proves the CPU build answers a token. For SGLang it runs
``python -m sglang.launch_server --help``; for vLLM ``vllm --version``; for
TensorRT-LLM it checks the operator's Python (``engines.trtllm.python``)
imports ``tensorrt_llm`` and has ``trtllm-serve`` beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from llmgw.engines import llamacpp
from llmgw.engines.engine import Compute
from llmgw.engines.trtllm import serve_program

NO_USABLE_GPU = "no usable GPU found"
CUDA_BUILD_FIX = (
    "install a CUDA build of llama.cpp: run 'llmgw engine install' on this machine with the NVIDIA "
    "driver loaded ('nvidia-smi' answers), or pass --bin with a CUDA build's llama-server"
)


@dataclass(frozen=True)
class CheckResult:
    """What a check found, and the fix when the build does not compute where it should."""

    ok: bool
    found: str
    fix: str = ""


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


async def _run(argv: list[str], timeout_s: float) -> tuple[int, str]:
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


async def check_sglang(python: Path, timeout_s: float = 120.0) -> CheckResult:
    code, output = await _run([str(python), "-m", "sglang.launch_server", "--help"], timeout_s)
    if code == 0:
        return CheckResult(True, f"SGLang answers 'python -m sglang.launch_server --help' with {python}")
    return CheckResult(
        False,
        f"SGLang does not start with {python}: {output.splitlines()[-1] if output else code}",
        "install SGLang into that Python's environment, or leave engines.sglang.program empty "
        "and let the agent install a build",
    )


async def check_vllm(program: Path, timeout_s: float = 120.0) -> CheckResult:
    code, output = await _run([str(program), "--version"], timeout_s)
    if code == 0:
        return CheckResult(True, f"vLLM {output.splitlines()[-1] if output else ''} at {program}".strip())
    return CheckResult(
        False,
        f"{program} --version failed: {output.splitlines()[-1] if output else code}",
        "reinstall vLLM there, or leave engines.vllm.program empty and let the agent install a build",
    )


async def check_trtllm(python: Path | None, timeout_s: float = 120.0) -> CheckResult:
    """The operator's TensorRT-LLM: a Python that imports it, with ``trtllm-serve`` beside it."""
    if python is None:
        return CheckResult(
            False,
            "engines.trtllm.python is not set in agent.yaml",
            "install TensorRT-LLM into a Python environment and name that Python in engines.trtllm.python",
        )
    code, output = await _run(
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
