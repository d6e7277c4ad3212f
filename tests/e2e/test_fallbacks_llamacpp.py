"""A model that cannot be placed here (it needs an H100) falls back to SmolLM2 on real llama-server:
the client gets SmolLM2's answer, whole and streamed, named in ``x-llmgw-served-by``, at about the
time a request to SmolLM2 itself takes."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.testing.cluster import Cluster

pytestmark = pytest.mark.e2e

SMOL = "smol"
BIG = "big-on-h100"
CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def fallen(
    tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path
) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("fallbacks"), engine_cache) as running:
        running.start_server()
        sha256 = running.add_model(SMOL, model_file, {"ctx_size": 2048, "parallel": 2})
        running.admin.request(
            "POST",
            "/api/models",
            {
                "name": BIG,
                "source": {"sha256": sha256, "filename": model_file.name},
                "profile": {"gpu_class": "h100", "ctx_size": 2048},
                "fallbacks": [SMOL],
            },
        )
        running.create_key()
        running.start_agent("node1")
        running.wait_ready(SMOL, 180)
        yield running


def _timed(client: httpx.Client, model: str) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    answer = client.post("/chat/completions", json={**CHAT, "model": model})
    return time.perf_counter() - started, answer


def test_a_model_without_a_replica_is_answered_by_its_fallback(fallen: Cluster) -> None:
    headers = {"Authorization": f"Bearer {fallen.key}"}
    with httpx.Client(base_url=f"{fallen.url}/v1", headers=headers, timeout=60) as client:
        plain = [_timed(client, SMOL) for _ in range(5)]
        fell = [_timed(client, BIG) for _ in range(5)]
        for _, answer in plain:
            assert answer.status_code == 200 and answer.headers["x-llmgw-served-by"] == SMOL
        for _, answer in fell:
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-llmgw-served-by"] == SMOL
            assert answer.json()["choices"][0]["message"]["content"]
        direct_s = statistics.median(s for s, _ in plain)
        fallback_s = statistics.median(s for s, _ in fell)
        print(f"\nmedian: {SMOL} {direct_s * 1000:.1f} ms, {BIG} (fallback) {fallback_s * 1000:.1f} ms")
        # no wait for a replica that cannot come: the fallback answers in the time a request takes
        assert fallback_s < direct_s + 1.0
        with client.stream(
            "POST", "/chat/completions", json={**CHAT, "model": BIG, "stream": True}
        ) as stream:
            assert stream.status_code == 200 and stream.headers["x-llmgw-served-by"] == SMOL
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and len(lines) > 2
