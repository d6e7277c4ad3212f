"""The store failing over under Patroni (C1.1): two PostgreSQL members and etcd, two control planes,
one agent with the stand-in engine; the primary's machine dies (kill -9 of its Patroni and its
postmaster) under steady /v1 traffic and admin writes.

The control planes name both members with ``target_session_attrs=read-write``, so they reconnect
to whichever Patroni promotes. What must hold: cp1 keeps leading, no /v1 request fails, and every
admin write that was answered 2xx is in the store afterwards.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from llmgw.errors import LlmgwError
from llmgw.store import Leases, LeaseState, Store
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.components import missing
from llmgw.testing.llama_server_standin import write_launcher
from llmgw.testing.patroni import Member, PatroniCluster, available
from llmgw.testing.traffic import Traffic

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not available(), reason=missing("etcd and Patroni", "run 'make patroni'")),
]

MODEL = "standin-chat"
LEASE_S = 20.0
"""Longer than Patroni takes to promote (its ttl, 8 s, plus a loop): the store's outage is shorter
than the lease, so the leader must keep leading through it."""


@dataclass
class AdminWrites:
    """A thread creating API keys one after another through ``cluster``; each answer kept."""

    cluster: Cluster
    prefix: str
    """The keys' names start with it (each run its own: a name taken is refused)."""
    pause_s: float = 0.2
    done: list[tuple[float, str]] = field(default_factory=list)
    """(when answered, key name) of every write answered 2xx."""
    refused: list[tuple[float, str]] = field(default_factory=list)
    """(when answered, error) of every write that was not."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> AdminWrites:
        self._thread = threading.Thread(target=self._run, name="admin-writes", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            number += 1
            name = f"{self.prefix}-{number}"
            try:
                self.cluster.admin.request("POST", "/api/keys", {"name": name})
            except (LlmgwError, OSError) as error:
                self.refused.append((time.monotonic(), str(error)[:200]))
            else:
                self.done.append((time.monotonic(), name))
            self._stop.wait(self.pause_s)

    def working_again_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the first write answered 2xx after it."""
        return next((at - moment for at, _ in list(self.done) if at > moment), None)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)


@pytest.fixture(scope="module")
def patroni() -> Iterator[PatroniCluster]:
    with PatroniCluster.start(members=2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory, patroni: PatroniCluster) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("store-failover")
    with Cluster(home / "cluster", home / "cache", store_url=patroni.url, lease_s=LEASE_S) as cluster:
        cluster.start_leader_and_standby()
        cluster.add_standin_model(MODEL)
        cluster.create_key("tests")
        launcher = write_launcher(home / "bin" / "llama-server")
        cluster.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
        cluster.start_agent("node1")
        cluster.wait_ready(MODEL, 60)
        yield cluster


def key_names(cluster: Cluster) -> set[str]:
    return {str(k["name"]) for k in cluster.admin.get("/api/keys")}


def lease(url: str) -> LeaseState:
    async def read() -> LeaseState:
        async with await Store.open(url) as store:
            return await Leases(store).current()

    return asyncio.run(read())


@dataclass
class LeaderStates:
    """A thread reading ``GET /leader`` of one control plane every 0.2 s: the states it said."""

    url: str
    seen: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> LeaderStates:
        threading.Thread(target=self._run, name="leader-states", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                with urllib.request.urlopen(f"{self.url}/leader", timeout=5) as answer:
                    self.seen.append(str(json.load(answer)["state"]))
            except urllib.error.HTTPError as error:
                self.seen.append(f"{error.code}")
            except OSError as error:
                self.seen.append(f"no answer: {error}")

    def stop(self) -> list[str]:
        self._stop.set()
        return self.seen


def ride_out(ha: Cluster, patroni: PatroniCluster, fault: Callable[[Member], object], what: str) -> str:
    """Apply ``fault`` to the primary under /v1 traffic and admin writes; check what must hold and
    say what was measured."""
    old = patroni.wait_healthy()
    before = lease(patroni.url)
    states = LeaderStates(ha.url).start()
    traffic = Traffic(ha.url, ha.key, MODEL, pause_s=0.05, timeout_s=30).start()
    writes = AdminWrites(ha, prefix=f"write-{old.name}-{time.monotonic():.0f}").start()
    try:
        wait_for(lambda: len(writes.done) >= 5 and len(traffic.outcomes) >= 10, 30, "writes and traffic flow")
        written = len(writes.done)
        killed = time.monotonic()
        fault(old)
        wait_for(lambda: writes.working_again_after(killed) is not None, 60, "admin writes work again")
        writes_back_s = writes.working_again_after(killed)
        primary = patroni.wait_primary(60)
        wait_for(
            lambda: len(traffic.outcomes) > 0 and traffic.outcomes[-1].started > killed + LEASE_S,
            60,
            "traffic",
        )
    finally:
        writes.stop()
        outcomes = traffic.stop()
        said = states.stop()
    failed = [o for o in outcomes if not o.ok]
    assert failed == [], f"/v1 requests failed: {failed[:3]}\n{ha.tails()}"
    after = lease(patroni.url)
    assert (after.holder, after.epoch) == ("cp1", before.epoch), "the lease changed hands"
    assert set(said) == {"leading"}, f"cp1's /leader said {sorted(set(said))} meanwhile"
    missing = {name for _, name in writes.done} - key_names(ha)
    assert not missing, f"writes answered 2xx but not in the store: {sorted(missing)}"
    assert len(writes.done) > written + 5
    return (
        f"{what}: {old.name} was primary, then {primary.name}; admin writes worked again after "
        f"{writes_back_s:.1f} s ({len(writes.refused)} refused meanwhile); "
        f"/v1: {len(failed)} of {len(outcomes)} requests failed"
    )


def test_the_leader_rides_out_a_patroni_failover_without_failing_a_request_or_losing_a_write(
    ha: Cluster, patroni: PatroniCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    def machine_dies(member: Member) -> None:
        patroni.kill(member)
        patroni.wait_primary(60, other_than=member)

    said = ride_out(ha, patroni, machine_dies, "the primary's machine died (Patroni and postmaster)")
    with capsys.disabled():
        print(f"\n{said}")


def test_the_leader_rides_out_the_primary_s_postmaster_killed_alone(
    ha: Cluster, patroni: PatroniCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    for member in patroni.members:  # the member killed before rejoins, as a replica
        if member.process is None:
            patroni.start_member(member)
    said = ride_out(ha, patroni, patroni.kill_postmaster, "the primary's postmaster was killed alone")
    with capsys.disabled():
        print(f"\n{said}")
