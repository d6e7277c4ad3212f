"""A real llama-server with two LoRA adapters: each request is answered with the adapter it names only.

SmolLM2 with two GGUF LoRA adapters written for it (``llmgw.testing.gguf_lora``:
every value one constant, so an applied adapter changes the greedy answer).
The model's own requests must answer as the model alone does, although
llama-server applies every adapter to a request that does not say otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmgw.testing.cluster import Cluster
from llmgw.testing.gguf_lora import write_lora

pytestmark = pytest.mark.e2e

MODEL = "smollm2-lora"


@pytest.fixture(scope="module")
def lora_llama(
    tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path
) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("lora-llama")
    targets = [f"blk.{block}.ffn_down.weight" for block in range(4)]  # enough to change the answer
    files = {
        "strong": write_lora(home / "strong.gguf", model_file, targets, value=0.2),
        "mild": write_lora(home / "mild.gguf", model_file, targets, value=0.05),
    }
    with Cluster(home / "cluster", engine_cache) as running:
        running.start_server()
        adapters = []
        for name, file in files.items():
            blob = running.upload(file)
            adapters.append({"name": f"{MODEL}-{name}", "sha256": blob["sha256"], "filename": file.name})
        adapters[0]["scale"] = 0.5
        blob = running.upload(model_file)
        running.admin.request(
            "POST",
            "/api/models",
            {
                "name": MODEL,
                "source": {"sha256": blob["sha256"], "filename": model_file.name},
                "profile": {"ctx_size": 1024, "parallel": 1},
                "adapters": adapters,
            },
        )
        running.create_key()
        running.start_agent("node1")
        running.wait_ready(MODEL, 120)
        yield running


def answer(cluster: Cluster, model: str) -> str:
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=60)
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Name a color."}], max_tokens=12, temperature=0
    )
    return reply.choices[0].message.content or ""


def test_the_model_answers_as_itself_and_each_adapter_as_itself(lora_llama: Cluster) -> None:
    alone = answer(lora_llama, MODEL)
    strong, mild = answer(lora_llama, f"{MODEL}-strong"), answer(lora_llama, f"{MODEL}-mild")
    assert len({alone, strong, mild}) == 3  # each request got its own adapter, or none
    assert answer(lora_llama, MODEL) == alone  # an adapter's request left nothing behind
