"""Relaying through a standby, with real processes: two control planes on PostgreSQL, an agent
running the llama-server stand-in (its streams slowed so a client can leave mid-way).

A client leaving the standby mid-stream cancels the engine's request (the
stand-in's ``requests_processing`` falls back) while another stream through
the same standby goes on; bodies far over gRPC's default message limit pass
through the standby whole.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import STREAM_CHUNKS
from llmgw.testing.postgres import PostgresServer

pytestmark = pytest.mark.e2e

MODEL = "standin-chat"
CHUNK_INTERVAL_MS = 150
"""Between the stand-in's streamed events: a whole stream takes about 64 x 0.15 s = 10 s."""
CANCELLED_WITHIN_S = 4.0
"""How soon the engine must see a client that left: well before its stream would have ended."""
UPLOAD = 64 << 20
"""The body uploaded to the mirror through the standby: sixteen times gRPC's default receive limit."""
V1_BODY = 20 << 20
"""A /v1 request body through the standby: under the gateway's 32 MiB, five times gRPC's default."""


def slow_standin(path: Path) -> Path:
    """An executable running the llama-server stand-in with its streamed events spaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!{sys.executable}\nimport os, runpy\n"
        f"os.environ['LLMGW_STANDIN_CHUNK_INTERVAL_MS'] = '{CHUNK_INTERVAL_MS}'\n"
        "runpy.run_module('llmgw.testing.llama_server_standin', run_name='__main__', alter_sys=True)\n"
    )
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """cp1 leading, cp2 standing by, on PostgreSQL; node1 serving the slowed stand-in."""
    home = tmp_path_factory.mktemp("relaying")
    with PostgresServer.start() as database:
        with Cluster(home / "cluster", home / "cache", store_url=database.url, lease_s=5.0) as cluster:
            cluster.start_leader_and_standby(20)
            cluster.add_standin_model(MODEL)
            cluster.create_key("tests", via=cluster.admin_of("cp2"))
            launcher = slow_standin(home / "bin" / "llama-server")
            cluster.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
            cluster.start_agent("node1")
            cluster.wait_ready(MODEL, 60)
            yield cluster


def engine_processing(ha: Cluster) -> int:
    """The stand-in's ``llamacpp:requests_processing``: the requests it is answering now."""
    port = ha.wait_ready(MODEL, 10)["port"]
    key = ha.engine_key(port)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {key}"})
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    line = next(line for line in text.splitlines() if line.startswith("llamacpp:requests_processing "))
    return int(float(line.split()[1]))


def start_stream(ha: Cluster, name: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A streamed chat request to control plane ``name``, its first event read."""
    port = ha.planes[name].http.port
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    connection.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {ha.key}", "Content-Type": "application/json"},
    )
    answer = connection.getresponse()
    assert answer.status == 200, answer.read()
    assert answer.readline().startswith(b"data: ")
    return connection, answer


def test_a_client_leaving_a_standby_mid_stream_cancels_the_engines_request_and_no_other(ha: Cluster) -> None:
    wait_for(lambda: engine_processing(ha) == 0 or None, 10, "the engine is idle")
    staying, staying_answer = start_stream(ha, "cp2")
    leaving, _ = start_stream(ha, "cp2")
    assert engine_processing(ha) == 2

    leaving.close()
    left = time.monotonic()
    wait_for(lambda: engine_processing(ha) == 1 or None, CANCELLED_WITHIN_S, "the engine cancels the request")
    assert time.monotonic() - left < CHUNK_INTERVAL_MS * STREAM_CHUNKS / 1000 / 2

    rest = staying_answer.read()
    staying.close()
    events = [line for line in rest.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]"
    assert len(events) >= STREAM_CHUNKS - 1  # every content event after the first, then [DONE]


class Generated:
    """A file-like body made on the fly: ``size`` bytes, never held whole."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.block = hashlib.sha256(b"relayed upload").digest() * 32768  # 1 MiB
        self.sha256 = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = (self.block * (n // len(self.block) + 1))[:n]
        self.left -= n
        self.sha256.update(data)
        return data


def test_a_large_upload_through_a_standby_reaches_the_leaders_mirror(ha: Cluster) -> None:
    body = Generated(UPLOAD)
    admin = ha.admin_of("cp2")
    admin.timeout_s = 120
    imported: dict[str, Any] = admin.request(
        "POST",
        "/api/mirror/blobs?filename=large.bin",
        data=body,
        length=UPLOAD,  # type: ignore[arg-type]
    )

    assert (imported["size"], imported["sha256"]) == (UPLOAD, body.sha256.hexdigest())
    listed = {blob["sha256"]: blob["size"] for blob in ha.admin_of("cp1").get("/api/mirror/blobs")}
    assert listed[imported["sha256"]] == UPLOAD


def test_a_v1_request_far_over_grpcs_default_limit_is_answered_through_a_standby(ha: Cluster) -> None:
    client = openai.OpenAI(base_url=f"{ha.url_of('cp2')}/v1", api_key=ha.key, max_retries=0, timeout=120)
    content = "relay " * (V1_BODY // 6)
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}])

    assert answer.choices[0].message.content


def test_events_through_the_standby_come_from_the_leader(ha: Cluster) -> None:
    headers = {"Authorization": f"Bearer {ha.token}"}
    with httpx.stream("GET", f"{ha.url_of('cp2')}/api/events", headers=headers, timeout=20) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        kinds = []
        for line in answer.iter_lines():
            if line.startswith("event: "):
                kinds.append(line.removeprefix("event: "))
            elif line.startswith("data: ") and kinds[-1] == "status":
                status = json.loads(line.removeprefix("data: "))
                break
    assert kinds == ["nodes", "replicas", "models", "settings", "serving", "keys", "status"]
    assert (status["name"], status["leader"]) == ("cp1", "cp1")
