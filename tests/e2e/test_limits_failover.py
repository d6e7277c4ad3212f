"""Budgets across a failover, with real processes: two control planes on PostgreSQL, an agent running
the llama-server stand-in. Tokens spent through the standby count (the leader answers them); the
counts reach the store within a second, and after ``kill -9`` of the leader the new leader enforces
the budget from where it stood."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import openai
import pytest

from llmgw.core.limits import Limits
from llmgw.store.database import Store
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import PROMPT_TOKENS

from .limited_project import MODEL, PROJECT, limited_project

pytestmark = pytest.mark.e2e

PER_REQUEST = PROMPT_TOKENS + 9
"""Tokens the stand-in reports for one whole chat answer."""
BUDGET = 20 * PER_REQUEST - 1
"""The project's daily budget: 20 requests are admitted (the 20th with one token left), then none."""
LEASE_S = 5.0


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str]]:
    """The project made through the standby (it relays to the leader); its key is the cluster's."""
    home = tmp_path_factory.mktemp("limits")
    limits = Limits(tokens_per_day=BUDGET)
    with limited_project(home, limits, lease_s=LEASE_S, via="cp2", ready_s=120) as made:
        made.cluster.key = made.key
        yield made.cluster, made.database_url


def spent(url: str) -> int:
    async def read() -> int:
        store = await Store.open(url)
        try:
            return (await store.limits.spent(time.time())).get(PROJECT, (0, 0))[0]
        finally:
            await store.close()

    return asyncio.run(read())


def admitted(cluster: Cluster, name: str, tries: int) -> int:
    client = openai.OpenAI(
        base_url=f"{cluster.url_of(name)}/v1", api_key=cluster.key, max_retries=0, timeout=30
    )
    count = 0
    for _ in range(tries):
        try:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        except openai.RateLimitError as error:
            assert "tokens_per_day" in str(error) and PROJECT in str(error)
            break
        count += 1
    return count


def test_a_budget_spent_through_the_standby_counts_and_survives_kill_9_of_the_leader(
    ha: tuple[Cluster, str],
) -> None:
    cluster, url = ha
    assert cluster.leader() == "cp1"
    assert admitted(cluster, "cp2", 8) == 8  # through the standby: the leader counts
    wait_for(lambda: spent(url) == 8 * PER_REQUEST or None, 5, "the leader writes the counts")

    cluster.admin = cluster.admin_of("cp2")
    cluster.kill(cluster.process_name("cp1"), signal.SIGKILL)
    wait_for(lambda: cluster.leader() == "cp2", LEASE_S * 3, "cp2 leads")
    cluster.wait_ready(MODEL, 60)

    assert admitted(cluster, "cp2", 30) == 12  # 8 + 12 = 20 requests: the budget as if no failover
    wait_for(lambda: spent(url) == 20 * PER_REQUEST or None, 5, "the new leader writes the counts")
