"""kill -9 of the leader in the middle of an adapter roll: the new leader finishes it, with real processes.

Two control planes on PostgreSQL, one agent running llama-server's stand-in. A
model of two replicas is given a LoRA adapter (written to the store, as a
published training job does): its engine takes adapters only at start, so the
leader rolls it, placing one replica more with the adapter (the surge) before
draining an old one. The stand-in's launcher holds any engine started with an
adapter until the test lets it go, so the leader is killed at a known point:
the surge placed and starting, no old replica drained yet. The standby takes
over, keeps the same surge (it neither drains a replica for being one too many
nor places another), and once the surge serves finishes the roll. A client
through the standby throughout sees no request fail.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.store.database import Store
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.postgres import PostgresServer

pytestmark = pytest.mark.e2e

MODEL = "rolled-chat"
ADAPTER = "tone"
LEASE_S = 5.0
COUNT = 2
"""The model's replicas before the roll, and after it."""
PASS_S = 2.0
"""The reconciler's interval (``reconcile.interval_s``'s default)."""


def write_gated_launcher(path: Path, gate: Path, held: Path) -> Path:
    """An executable running llama-server's stand-in; started with a LoRA adapter, it first touches
    ``held`` and waits until ``gate`` exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, runpy, sys, time\n"
        "if any(arg.startswith('--lora') for arg in sys.argv[1:]):\n"
        f"    pathlib.Path({str(held)!r}).touch()\n"
        f"    while not pathlib.Path({str(gate)!r}).exists():\n"
        "        time.sleep(0.05)\n"
        "runpy.run_module('llmgw.testing.llama_server_standin', run_name='__main__', alter_sys=True)\n"
    )
    path.chmod(0o755)
    return path


def put_definition(url: str, definition: dict[str, Any]) -> None:
    """Change the model's definition in the store, as publishing a training job's adapter does."""

    async def put() -> None:
        store = await Store.open(url)
        try:
            await store.models.put(MODEL, definition)
        finally:
            await store.close()

    asyncio.run(put())


def chat(cluster: Cluster, name: str) -> str:
    client = openai.OpenAI(
        base_url=f"{cluster.url_of(name)}/v1", api_key=cluster.key, max_retries=0, timeout=30
    )
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    return answer.choices[0].message.content or ""


def answered_here(cluster: Cluster, name: str) -> float:
    """Successful /v1 requests the gateway of control plane ``name`` answered itself (its /metrics)."""
    text = cluster.metrics(name)
    counted = [line for line in text.splitlines() if line.startswith("llmgw_gateway_requests_total{")]
    return sum(
        float(line.split()[-1]) for line in counted if f'model="{MODEL}"' in line and 'code="200"' in line
    )


def replicas_on(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [r for r in cluster.admin_of(name).get("/api/replicas") if r["model"] == MODEL]


class Steady(threading.Thread):
    """One request after another through cp2 until stopped; the failures."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.sent = 0
        self.errors: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                chat(self.cluster, "cp2")
            except openai.OpenAIError as error:
                self.errors.append(str(error)[:200])
            self.sent += 1
            self.halt.wait(0.05)


@dataclass
class Rolling:
    cluster: Cluster
    store_url: str
    with_adapter: dict[str, Any]
    """The model's definition once given the adapter."""
    gate: Path
    """Touched: engines started with an adapter go on."""
    held: Path
    """There once an engine started with an adapter waits at the gate."""


@pytest.fixture(scope="module")
def rolling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rolling]:
    """cp1 leading, cp2 standing by, on PostgreSQL; node1 serving the model's two replicas."""
    home = tmp_path_factory.mktemp("leader-state")
    with PostgresServer.start() as database:
        with Cluster(home / "cluster", home / "cache", store_url=database.url, lease_s=LEASE_S) as cluster:
            cluster.start_leader_and_standby(20)
            weights = cluster.upload(filename=f"{MODEL}.gguf", data=b"GGUF stand-in\n")
            adapter = cluster.upload(filename=f"{ADAPTER}.gguf", data=b"GGUF lora stand-in\n")
            definition: dict[str, Any] = {
                "name": MODEL,
                "source": {"sha256": weights["sha256"], "filename": f"{MODEL}.gguf"},
                "replicas": {"min": COUNT, "max": COUNT},
            }
            cluster.admin.request("POST", "/api/models", definition)
            cluster.create_key("tests", via=cluster.admin_of("cp2"))
            gate, held = home / "gate", home / "held"
            launcher = write_gated_launcher(home / "bin" / "llama-server", gate, held)
            cluster.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
            cluster.start_agent("node1")
            wait_for(
                lambda: len(ready(replicas_on(cluster, "cp1"))) == COUNT or None, 60, "the replicas serve"
            )
            tone = {
                "name": ADAPTER,
                "sha256": adapter["sha256"],
                "size": adapter["size"],
                "filename": f"{ADAPTER}.gguf",
            }
            yield Rolling(cluster, database.url, {**definition, "adapters": [tone]}, gate, held)


def ready(replicas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in replicas if r["state"] == "ready" and not r["draining"]]


def test_kill_9_of_the_leader_mid_roll_the_new_leader_finishes_it(rolling: Rolling) -> None:
    cluster = rolling.cluster
    before = {r["id"] for r in replicas_on(cluster, "cp1")}

    def served_by_cp2() -> bool | None:
        """True once cp2's own gateway answered (before it holds the leader's state, it relays)."""
        chat(cluster, "cp2")
        return answered_here(cluster, "cp2") > 0 or None

    wait_for(served_by_cp2, 20, "cp2 serves /v1 itself")
    client = Steady(cluster)
    client.start()
    try:
        wait_for(lambda: client.sent >= 5 or None, 10, "steady traffic through cp2")
        put_definition(rolling.store_url, rolling.with_adapter)  # the roll begins
        wait_for(lambda: rolling.held.exists() or None, 30, "the surge's engine starting, held")
        (surge,) = {r["id"] for r in replicas_on(cluster, "cp1")} - before
        assert not any(r["draining"] for r in replicas_on(cluster, "cp1"))  # no old one drained yet
        cluster.kill(cluster.process_name("cp1"), signal.SIGKILL)
        wait_for(lambda: cluster.leader() == "cp2" or None, LEASE_S * 4, "cp2 leads")
        wait_for(lambda: len(ready(replicas_on(cluster, "cp2"))) == COUNT or None, 30, "node1 back at cp2")
        time.sleep(3 * PASS_S)  # passes of the new leader while the surge starts: nothing drained nor placed
        now = replicas_on(cluster, "cp2")
        assert {r["id"] for r in now} == before | {surge}
        assert [r["id"] for r in now if r["draining"]] == []

        rolling.gate.touch()  # the surge serves: the roll goes on

        def rolled() -> list[dict[str, Any]] | None:
            now = replicas_on(cluster, "cp2")
            done = len(now) == COUNT and all(ADAPTER in r["adapters"] for r in ready(now))
            return now if done and len(ready(now)) == COUNT else None

        final = wait_for(rolled, 60, "every replica holds the adapter")
        sent = client.sent
        wait_for(lambda: client.sent >= sent + 10 or None, 10, "requests after the roll")
    finally:
        client.halt.set()
        client.join(30)
    assert surge in {r["id"] for r in final} and not before & {r["id"] for r in final}
    assert client.errors == []
