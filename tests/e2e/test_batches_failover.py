"""A batch of 1,000 chat requests on SmolLM2, through real processes: two control planes on PostgreSQL,
an agent and llama-server. The batch is made through the standby, run by the leader on the slots
interactive traffic leaves free, and carried on by the standby after kill -9 of the leader: 1,000
results, every ``custom_id`` once. An interactive client's p99 during the batch stays within 1.5 times
its p99 without it, at the default ``batches.share`` (docs/batches.md, "How much a batch takes").

The tests run in this file's order against one cluster. Figures go to stdout (``-s`` shows them).
"""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.cli.up import DEFAULT_MODEL
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.postgres import PostgresServer

pytestmark = pytest.mark.e2e

LEASE_S = 5.0
REQUESTS = 1000
INTERACTIVE = 100
"""Interactive requests timed without the batch, and again during it (p99: the 99th slowest)."""
P99_RATIO = 1.5
ENDED = ("completed", "failed", "expired", "cancelled")


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path) -> Iterator[Cluster]:
    """cp1 leading, cp2 standing by, on PostgreSQL; node1 serving SmolLM2 with four slots."""
    home = tmp_path_factory.mktemp("batches")
    with PostgresServer.start() as database:
        with Cluster(home / "cluster", engine_cache, store_url=database.url, lease_s=LEASE_S) as cluster:
            cluster.start_leader_and_standby(20)
            cluster.add_model(DEFAULT_MODEL, model_file, {"ctx_size": 2048, "parallel": 4})
            cluster.create_key("tests")
            cluster.start_agent("node1")
            cluster.wait_ready(DEFAULT_MODEL, 180)
            yield cluster


def sdk(cluster: Cluster, name: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{cluster.url_of(name)}/v1", api_key=cluster.key, max_retries=0, timeout=60
    )


def interactive_p99(client: openai.OpenAI, count: int) -> float:
    """The p99 of one client's ``count`` chat requests, one at a time."""
    took = []
    for n in range(count):
        started = time.monotonic()
        client.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=[{"role": "user", "content": f"Count to {n % 7 + 2}."}],
            max_tokens=8,
        )
        took.append(time.monotonic() - started)
    took.sort()
    return took[math.ceil(len(took) * 0.99) - 1]  # nearest rank


def requests_file() -> bytes:
    lines = []
    for n in range(REQUESTS):
        body = {
            "model": DEFAULT_MODEL,
            "messages": [{"role": "user", "content": f"Say {n}."}],
            "max_tokens": 2,
        }
        lines.append(
            json.dumps(
                {"custom_id": f"req-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            )
        )
    return ("\n".join(lines) + "\n").encode()


def batch_of(client: openai.OpenAI, batch_id: str) -> Any:
    return client.batches.retrieve(batch_id)


def answered(client: openai.OpenAI, batch_id: str) -> int:
    counts = batch_of(client, batch_id).request_counts
    return 0 if counts is None else counts.completed + counts.failed


def test_a_batch_survives_kill_9_of_the_leader_and_spares_interactive_latency(ha: Cluster) -> None:
    client = sdk(ha, "cp2")
    wait_for(lambda: client.models.list().data or None, 20, "cp2 serves /v1")
    alone_p99 = interactive_p99(client, INTERACTIVE)

    uploaded = client.files.create(file=("requests.jsonl", requests_file()), purpose="batch")
    assert sdk(ha, "cp1").files.content(uploaded.id).content == requests_file(), "any plane reads it"
    started = time.monotonic()
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_for(lambda: answered(client, batch.id) >= 20 or None, 120, "the batch runs")
    during_p99 = interactive_p99(client, INTERACTIVE)
    before_kill = answered(client, batch.id)
    assert before_kill < REQUESTS * 0.8, f"the batch went too fast to be cut ({before_kill} answered)"

    ha.kill(ha.process_name("cp1"), signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: ha.leader() == "cp2" or None, LEASE_S * 6, "cp2 leads")
    led_s = time.monotonic() - killed
    at_lead = answered(client, batch.id)
    wait_for(lambda: answered(client, batch.id) > at_lead or None, 60, "cp2 carries the batch on")
    resumed_s = time.monotonic() - killed

    done = wait_for(
        lambda: ((b := batch_of(client, batch.id)).status in ENDED and b) or None,
        600,
        "the batch ends",
        interval_s=1.0,
    )
    took_s = time.monotonic() - started
    assert done.status == "completed", done
    assert done.request_counts is not None and done.request_counts.completed == REQUESTS
    assert done.output_file_id is not None
    lines = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    ids = [line["custom_id"] for line in lines]
    assert sorted(ids) == sorted(f"req-{n}" for n in range(REQUESTS)), "every custom_id once"
    assert all(line["response"]["status_code"] == 200 for line in lines)
    assert done.error_file_id is None

    figures = {
        "requests": REQUESTS,
        "batch_s": round(took_s, 1),
        "batch_per_s": round(REQUESTS / took_s, 1),
        "interactive_p99_alone_ms": round(alone_p99 * 1000),
        "interactive_p99_during_ms": round(during_p99 * 1000),
        "p99_ratio": round(during_p99 / alone_p99, 2),
        "answered_at_kill": before_kill,
        "new_leader_after_s": round(led_s, 1),
        "batch_resumed_after_s": round(resumed_s, 1),
    }
    print("\nbatch figures:", json.dumps(figures))
    assert during_p99 <= alone_p99 * P99_RATIO, figures
