"""A standby serves /v1 itself from the leader's streamed gateway state, with real processes: two control
planes on PostgreSQL, an agent running the llama-server stand-in.

The standby forwards to the replica itself (its own gateway counts the requests), a key revoked on the
leader is refused at the standby within a second, and kill -9 of the leader under a steady client through
the standby fails no request and slows none past a second (the lease is 5 s). The tests run in this
file's order against one cluster; the last one kills the leader.
"""

from __future__ import annotations

import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import write_launcher
from llmgw.testing.postgres import PostgresServer

pytestmark = pytest.mark.e2e

MODEL = "standin-chat"
LEASE_S = 5.0
REVOKED_WITHIN_S = 1.0
SLOWEST_S = 1.0


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """cp1 leading, cp2 standing by, on PostgreSQL; node1 serving the stand-in."""
    home = tmp_path_factory.mktemp("standby-serves")
    with PostgresServer.start() as database:
        with Cluster(home / "cluster", home / "cache", store_url=database.url, lease_s=LEASE_S) as cluster:
            cluster.start_leader_and_standby(20)
            cluster.add_standin_model(MODEL)
            cluster.create_key("tests", via=cluster.admin_of("cp2"))
            launcher = write_launcher(home / "bin" / "llama-server")
            cluster.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
            cluster.start_agent("node1")
            cluster.wait_ready(MODEL, 60)
            yield cluster


def chat(cluster: Cluster, name: str, key: str, timeout_s: float = 30) -> str:
    client = openai.OpenAI(
        base_url=f"{cluster.url_of(name)}/v1", api_key=key, max_retries=0, timeout=timeout_s
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


def models_status(cluster: Cluster, name: str, key: str) -> int:
    request = urllib.request.Request(
        f"{cluster.url_of(name)}/v1/models", headers={"Authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_the_standby_answers_v1_with_its_own_gateway(ha: Cluster) -> None:
    def served_by_cp2() -> bool | None:
        """True once cp2's own gateway answered a request (before it holds the leader's state, it relays)."""
        chat(ha, "cp2", ha.key)
        return answered_here(ha, "cp2") > 0 or None

    wait_for(served_by_cp2, 20, "cp2 serves /v1 itself")
    before_here, before_leader = answered_here(ha, "cp2"), answered_here(ha, "cp1")
    for _ in range(3):
        assert chat(ha, "cp2", ha.key)
    assert answered_here(ha, "cp2") == before_here + 3
    assert answered_here(ha, "cp1") == before_leader  # nothing relayed


def test_a_key_revoked_on_the_leader_is_refused_at_the_standby_within_a_second(ha: Cluster) -> None:
    created = ha.admin_of("cp1").request("POST", "/api/keys", {"name": "revoked-soon"})
    wait_for(lambda: models_status(ha, "cp2", created["key"]) == 200 or None, 5, "cp2 knows the new key")
    revoking = time.monotonic()
    ha.admin_of("cp1").request("DELETE", f"/api/keys/{created['id']}")
    while models_status(ha, "cp2", created["key"]) != 401:
        assert time.monotonic() - revoking < REVOKED_WITHIN_S, "cp2 still takes the revoked key"
        time.sleep(0.02)
    assert time.monotonic() - revoking < REVOKED_WITHIN_S
    assert models_status(ha, "cp2", ha.key) == 200


class Steady(threading.Thread):
    """One request after another through cp2 until stopped; the failures and the slowest."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.sent = 0
        self.errors: list[str] = []
        self.slowest_s = 0.0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            started = time.monotonic()
            try:
                chat(self.cluster, "cp2", self.cluster.key, timeout_s=30)
            except openai.OpenAIError as error:
                self.errors.append(str(error)[:200])
            self.sent += 1
            self.slowest_s = max(self.slowest_s, time.monotonic() - started)
            self.halt.wait(0.05)


def test_kill_9_of_the_leader_fails_and_stalls_no_request_through_the_standby(ha: Cluster) -> None:
    client = Steady(ha)
    client.start()
    try:
        wait_for(lambda: client.sent >= 5 or None, 10, "steady traffic")
        ha.kill(ha.process_name("cp1"), signal.SIGKILL)
        killed_at = client.sent
        wait_for(lambda: ha.leader() == "cp2" or None, LEASE_S * 4, "cp2 leads")
        led_at = client.sent
        wait_for(lambda: client.sent >= led_at + 10 or None, 10, "requests after cp2 leads")
    finally:
        client.halt.set()
        client.join(30)
    assert client.sent - killed_at >= 20  # the failover was crossed under load
    assert client.errors == []
    assert client.slowest_s < SLOWEST_S
