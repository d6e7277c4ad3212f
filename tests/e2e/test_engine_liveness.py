"""A frozen engine (SIGSTOP) is killed and started again by its agent (``shards.liveness_s``).

The node here gives a ready engine ``LIVENESS_S`` without an answer to its
health check (the default is 30 s), under steady traffic from a client.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmgw.cli.up import DEFAULT_MODEL
from llmgw.testing.cluster import Cluster, engine_pid, wait_for
from llmgw.testing.traffic import Outcome, Traffic

pytestmark = pytest.mark.e2e

LIVENESS_S = 3.0
ANSWERED_WITHIN_S = 20.0
"""Well before the 60 s a frozen engine used to hold its requests."""


@pytest.fixture
def cluster(tmp_path: Path, engine_cache: Path, model_file: Path) -> Iterator[Cluster]:
    """SmolLM2 on one node whose engines have ``LIVENESS_S`` to answer once ready."""
    with Cluster(tmp_path / "cluster", engine_cache) as running:
        running.start_server()
        running.add_model(DEFAULT_MODEL, model_file, {"ctx_size": 2048, "parallel": 2})
        running.create_key()
        running.add_node("node1", shards={"liveness_s": LIVENESS_S})
        running.start_agent("node1")
        running.wait_ready(DEFAULT_MODEL, 180)
        yield running


def _stream_until_it_ends(cluster: Cluster, started: threading.Event, ended: list[tuple[float, str]]) -> None:
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=90)
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "Tell a long story about a lighthouse."}],
        max_tokens=2000,
        stream=True,
    )
    try:
        for _ in stream:
            started.set()
        ended.append((time.monotonic(), "completed"))
    except openai.APIError as error:
        ended.append((time.monotonic(), f"error: {error}"))


def test_a_frozen_engine_is_killed_started_again_and_its_requests_answered(cluster: Cluster) -> None:
    before = cluster.wait_ready(DEFAULT_MODEL)
    pid = engine_pid(before["port"])
    traffic = Traffic(cluster.url, cluster.key, DEFAULT_MODEL, timeout_s=90, max_s=120).start()
    streaming, stream_ended = threading.Event(), list[tuple[float, str]]()
    sent: list[Outcome] = []
    try:
        wait_for(lambda: any(o.ok for o in traffic.outcomes), 30, "the traffic is served")
        threading.Thread(target=_stream_until_it_ends, args=(cluster, streaming, stream_ended)).start()
        assert streaming.wait(30), "the stream started"
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        probe = Traffic(cluster.url, cluster.key, DEFAULT_MODEL, timeout_s=90)
        sender = threading.Thread(target=lambda: sent.append(probe.send()))
        sender.start()  # sent to the frozen engine: the router still has it as ready
        recovered = wait_for(lambda: traffic.recovered_after(stopped_at), 60, "requests succeed again")
        sender.join(90)
        wait_for(lambda: stream_ended, 90, "the stream in flight ends")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # only if the test failed before the agent killed it
        traffic.stop()

    after = cluster.wait_ready(DEFAULT_MODEL)
    (request,) = sent
    stream_s = stream_ended[0][0] - stopped_at
    print(
        f"\nfrozen engine, shards.liveness_s={LIVENESS_S:g}: the stream in flight ended {stream_s:.1f} s "
        f"after SIGSTOP ({stream_ended[0][1][:120]}); a request sent to the frozen engine was answered "
        f"{request.status} after {request.ended - stopped_at:.1f} s; requests succeed again "
        f"{recovered:.1f} s after SIGSTOP; restarts {before['restarts']} -> {after['restarts']}"
    )
    assert engine_pid(after["port"]) != pid, "a new engine process serves"
    assert after["restarts"] == before["restarts"] + 1
    assert "stopped answering its health check" in cluster.log("agent-node1").read_text()
    assert stream_ended[0][1].startswith("error") and stream_s < ANSWERED_WITHIN_S
    # The request in flight on the frozen engine: its connection drops when the engine is killed, it
    # is tried once more (the port refuses it then), and the gateway answers 502 with Retry-After.
    assert request.status == 502 and request.ended - stopped_at < ANSWERED_WITHIN_S, request
    assert recovered < ANSWERED_WITHIN_S
