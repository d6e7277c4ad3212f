"""``GET /api/events`` on a real control plane: a console's view follows a node attaching, a model
added and its replica becoming ready, and the stream ends when the control plane stops."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.controlplane.admin.changes import KINDS
from llmgw.testing.cluster import Cluster

pytestmark = pytest.mark.e2e

MODEL = "standin-chat"
END = ("end", None)


def standin(path: Path) -> Path:
    """An executable running the llama-server stand-in."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!{sys.executable}\nimport runpy\n"
        "runpy.run_module('llmgw.testing.llama_server_standin', run_name='__main__', alter_sys=True)\n"
    )
    path.chmod(0o755)
    return path


class Subscriber:
    """An open /api/events stream, read on a thread of its own into a queue of (kind, data)."""

    def __init__(self, url: str, token: str) -> None:
        self.frames: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(url, token), daemon=True)
        self._thread.start()

    def _read(self, url: str, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        try:
            with httpx.stream("GET", f"{url}/api/events", headers=headers, timeout=60) as answer:
                kind = ""
                for line in answer.iter_lines():
                    if line.startswith("event: "):
                        kind = line.removeprefix("event: ")
                    elif line.startswith("data: "):
                        self.frames.put((kind, json.loads(line.removeprefix("data: "))))
        except httpx.HTTPError as error:
            self.frames.put(("error", str(error)))
        self.frames.put(END)

    def until(self, wanted: Callable[[str, Any], bool], timeout_s: float, what: str) -> tuple[str, Any]:
        seen = []
        while True:
            try:
                kind, data = self.frames.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(f"no event {what} within {timeout_s} s; saw {seen}") from None
            seen.append(kind)
            if wanted(kind, data):
                return kind, data
            if (kind, data) == END:
                raise AssertionError(f"the stream ended before {what}; saw {seen}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path / "cluster", tmp_path / "cache") as cluster:
        cluster.start_server("cp1")
        yield cluster


def test_a_subscriber_follows_the_cluster_and_the_stream_ends_with_the_control_plane(
    cluster: Cluster, tmp_path: Path
) -> None:
    events = Subscriber(cluster.url, cluster.token)
    initial = [events.until(lambda kind, data: True, 10, "of the initial state")[0] for _ in KINDS]
    assert initial == list(KINDS)

    cluster.add_node(
        "node1", engines={"llamacpp": {"binary": str(standin(tmp_path / "bin" / "llama-server"))}}
    )
    cluster.start_agent("node1")
    events.until(
        lambda kind, data: kind == "nodes" and [(n["id"], n["connected"]) for n in data] == [("node1", True)],
        30,
        "of node1 connected",
    )
    weights = tmp_path / "weights.gguf"
    weights.write_bytes(b"GGUF stand-in\n")
    cluster.add_model(MODEL, weights)
    latest: dict[str, Any] = {}

    def model_and_replica_ready(kind: str, data: Any) -> bool:
        latest[kind] = data  # replicas come before models in one batch: follow both views
        return [m["name"] for m in latest.get("models", [])] == [MODEL] and [
            (r["model"], r["state"]) for r in latest.get("replicas", [])
        ] == [(MODEL, "ready")]

    try:
        events.until(model_and_replica_ready, 60, "of the model and its replica ready")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{cluster.tails()}") from None

    server = cluster.processes.pop("server")
    server.send_signal(signal.SIGTERM)
    try:
        assert server.wait(20) == 0, cluster.tails()  # an open stream does not hold the stop
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        raise
    events.until(lambda kind, data: (kind, data) == END, 10, "of the stream's end")
