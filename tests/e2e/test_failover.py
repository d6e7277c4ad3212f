"""Two control planes on a real PostgreSQL, a real agent and llama-server: standbys, store outage, kill -9.

The tests run in this file's order against one cluster: the store outage
first (cp1 leads throughout), then the failover (cp2 leads after kill -9).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.cli.up import DEFAULT_MODEL
from llmgw.core.relays import RelayChunk, RelayRequest
from llmgw.errors import Unauthorized
from llmgw.pki.authority import Authority
from llmgw.protocol.grpc_client import GrpcConnector
from llmgw.protocol.grpc_transport import TlsFiles
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.postgres import PostgresServer, StoreCut

pytestmark = pytest.mark.e2e

LEASE_S = 5.0
OUTAGE_S = 15.0
"""Three leases and three store timeouts: the lease has expired on the database's clock by the time the
store returns, and every request of the outage met the store out of reach."""


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path) -> Iterator[Cluster]:
    """cp1 (leading) and cp2 (standing by) on PostgreSQL behind a cuttable proxy; node1 serving SmolLM2."""
    with PostgresServer.start() as database, StoreCut(database.port) as cut:
        cluster = Cluster(
            tmp_path_factory.mktemp("ha"), engine_cache, store_url=cut.url(database.url), lease_s=LEASE_S
        )
        cluster.cut = cut  # type: ignore[attr-defined]
        with cluster:
            cluster.start_leader_and_standby(20)
            standby = cluster.admin_of("cp2")
            cluster.sha256 = cluster.add_model(  # type: ignore[attr-defined]
                DEFAULT_MODEL, model_file, {"ctx_size": 2048, "parallel": 2}, via=standby
            )
            cluster.create_key("tests", via=standby)
            cluster.start_agent("node1")
            cluster.wait_ready(DEFAULT_MODEL, 180)
            yield cluster


def chat(cluster: Cluster, name: str, timeout_s: float = 60) -> str:
    client = openai.OpenAI(
        base_url=f"{cluster.url_of(name)}/v1",
        api_key=cluster.key,
        max_retries=0,
        timeout=timeout_s,
    )
    answer = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=4
    )
    return answer.choices[0].message.content or ""


def status_of(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.admin_of(name).get("/api/status")  # type: ignore[no-any-return]


def leader_answer(cluster: Cluster, name: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{cluster.url_of(name)}/leader", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_standby_answers_api_and_v1_through_the_leader(ha: Cluster) -> None:
    status = status_of(ha, "cp2")
    assert (status["name"], status["leader"], status["standbys"]) == ("cp1", "cp1", ["cp2"])
    assert status["replicas_ready"] == 1
    assert chat(ha, "cp2")
    assert leader_answer(ha, "cp1")[0] == 200
    assert leader_answer(ha, "cp2") == (
        503,
        {"leader": False, "name": "cp2", "state": "standby", "holder": "cp1"},
    )


def test_a_stream_through_a_standby_arrives_in_chunks(ha: Cluster) -> None:
    client = openai.OpenAI(
        base_url=f"{ha.url_of('cp2')}/v1",
        api_key=ha.key,
        max_retries=0,
        timeout=60,
    )
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=12,
        stream=True,
    )
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1


def relay_with(ha: Cluster, directory: Path, stem: str) -> list[RelayChunk]:
    tls = TlsFiles(directory / "ca.crt", directory / f"{stem}.crt", directory / f"{stem}.key")
    request = RelayRequest(method="GET", path="/api/status")

    async def relay() -> list[RelayChunk]:
        address = f"127.0.0.1:{ha.planes['cp1'].agent_server.port}"
        return [chunk async for chunk in GrpcConnector(address, tls).relay(request)]

    return asyncio.run(relay())


def test_the_leader_refuses_a_relay_from_a_node_certificate(ha: Cluster) -> None:
    with pytest.raises(Unauthorized, match="'node1' is a node's"):
        relay_with(ha, ha.home / "nodes" / "node1", "node")


def test_a_node_certificate_under_a_control_planes_name_cannot_relay(ha: Cluster, tmp_path: Path) -> None:
    """Even one issued by the cluster's CA (as an older node-cert would) passes for no control plane."""
    authority = Authority.load(ha.home)
    authority.issue("cp2", sans=["cp2"], usage="client", directory=tmp_path, stem="node")
    (tmp_path / "ca.crt").write_bytes((ha.home / "ca.crt").read_bytes())
    with pytest.raises(Unauthorized, match="'cp2' is a node's"):
        relay_with(ha, tmp_path, "node")


def test_a_store_outage_hangs_no_request_and_the_leader_keeps_leading(ha: Cluster) -> None:
    cut: StoreCut = ha.cut  # type: ignore[attr-defined]
    cut.cut()
    try:
        ends = time.monotonic() + OUTAGE_S
        slowest_api = slowest_chat = 0.0
        while time.monotonic() < ends:
            started = time.monotonic()
            with pytest.raises(Exception, match="store"):
                status_of(ha, "cp1")  # needs the store: a 503 naming it, not a hang
            slowest_api = max(slowest_api, time.monotonic() - started)
            started = time.monotonic()
            assert chat(ha, "cp1")  # the gateway serves from memory
            slowest_chat = max(slowest_chat, time.monotonic() - started)
        assert slowest_api < ha.config.store.timeout_s + 3
        assert slowest_chat < 10
        assert leader_answer(ha, "cp2")[0] == 503
    finally:
        cut.restore()
    wait_for(lambda: status_of(ha, "cp1")["leader"] == "cp1", 30, "cp1 answers from the store again")
    for _ in range(3):  # a few rounds after the store returned: the lease did not move
        assert status_of(ha, "cp2")["leader"] == "cp1"
        assert leader_answer(ha, "cp2")[0] == 503
        time.sleep(LEASE_S / 3)
    assert chat(ha, "cp2")


def llmgw(cluster: Cluster, *args: str) -> str:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmgw.cli.main",
            *args,
            "--url",
            cluster.url_of("cp2"),
            "--token",
            cluster.token,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
        check=True,
    )
    return result.stdout


def test_stop_and_start_through_a_standby(ha: Cluster) -> None:
    summary = llmgw(ha, "status")
    assert "leader" in summary and "cp1" in summary and "standbys" in summary and "cp2" in summary
    llmgw(ha, "stop")
    wait_for(lambda: not ha.replicas(DEFAULT_MODEL), 60, "every replica stopped")
    with pytest.raises(openai.APIStatusError) as refused:
        chat(ha, "cp2")
    assert refused.value.status_code == 503 and "system_stopped" in str(refused.value.body)
    assert "STOPPED" in llmgw(ha, "status")
    assert [m["name"] for m in ha.admin.get("/api/models")] == [DEFAULT_MODEL]  # no definition changed
    llmgw(ha, "start")
    ha.wait_ready(DEFAULT_MODEL, 120)
    assert chat(ha, "cp2")


def test_after_kill_9_of_the_leader_a_standby_leads_and_serves(ha: Cluster) -> None:
    standby = ha.admin_of("cp2")
    written = standby.request(
        "POST",
        "/api/models",
        {
            "name": "written-before",
            "source": {"sha256": ha.sha256, "filename": "m.gguf"},
            "replicas": {"min": 0},
        },  # type: ignore[attr-defined]
    )
    assert written["name"] == "written-before"
    replica = ha.replicas(DEFAULT_MODEL)[0]["id"]
    ha.admin = standby  # cp1 is about to die
    ha.kill("server", signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: ha.leader() == "cp2", LEASE_S * 3, "cp2 leads")
    wait_for(lambda: [n for n in standby.get("/api/nodes") if n["connected"]], 30, "node1 registers with cp2")
    registered_s = time.monotonic() - killed
    ready = wait_for(
        lambda: [r["id"] for r in ha.replicas(DEFAULT_MODEL) if r["state"] == "ready"],
        10,
        "the replica is adopted",
    )
    assert ready == [replica]  # adopted, not started again
    assert chat(ha, "cp2")
    assert "written-before" in [m["name"] for m in standby.get("/api/models")]
    assert registered_s < LEASE_S + 10
    assert [e["action"] for e in standby.get("/api/audit?limit=1")] == ["model.add"]


def test_a_leader_frozen_past_its_lease_never_answers_leader_200_once_thawed(ha: Cluster) -> None:
    """SIGSTOP the leader past its lease, let the other lead, SIGCONT it: from its first answer on it
    says it does not lead, so keepalived never moves the floating address back to a deposed leader."""
    ha.start_server("cp1")  # killed by the test above: back as a standby
    wait_for(lambda: ha.leader() == "cp2" and leader_answer(ha, "cp1")[0] == 503, 30, "cp1 stands by")
    frozen = ha.processes[ha.process_name("cp2")]
    frozen.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: leader_answer(ha, "cp1")[0] == 200, LEASE_S * 4, "cp1 leads while cp2 is frozen")
    finally:
        frozen.send_signal(signal.SIGCONT)
    answers = [leader_answer(ha, "cp2") for _ in range(10)]
    assert [code for code, _ in answers] == [503] * 10, answers
    wait_for(lambda: leader_answer(ha, "cp2")[1]["state"] == "standby", LEASE_S * 2, "cp2 stands by")
    assert leader_answer(ha, "cp1")[0] == 200
    ha.admin = ha.admin_of("cp1")
    assert chat(ha, "cp2")  # relayed to the new leader
