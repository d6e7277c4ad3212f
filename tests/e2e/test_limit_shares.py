"""A rate limit holds across control planes, with real processes: two control planes on PostgreSQL, an
agent running the llama-server stand-in. The leader divides the project's requests per minute between
itself and the standby serving /v1 (each holds about half), so 2N requests sent through both within
seconds admit about N, not 2N; once the standby stops, the leader holds the whole limit again."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from llmgw.core.limits import Limits
from llmgw.testing.cluster import Cluster, wait_for

from .limited_project import MODEL, limited_project

pytestmark = pytest.mark.e2e

PER_MINUTE = 20
LEASE_S = 5.0
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str]]:
    """cp1 leading, cp2 standing by; a key in a project limited to PER_MINUTE requests a minute, and
    one unlimited; the secret of the limited one."""
    home = tmp_path_factory.mktemp("limit-shares")
    limits = Limits(requests_per_minute=PER_MINUTE)
    with limited_project(home, limits, lease_s=LEASE_S, via="cp1", ready_s=60) as made:
        made.cluster.create_key("unlimited", via=made.admin)
        yield made.cluster, made.key


def post(cluster: Cluster, name: str, key: str) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(
        f"{cluster.url_of(name)}/v1/chat/completions",
        data=BODY,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}


def answered_here(cluster: Cluster, name: str) -> float:
    """Successful /v1 requests the gateway of control plane ``name`` answered itself (its /metrics)."""
    text = cluster.metrics(name)
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("llmgw_gateway_requests_total{") and 'code="200"' in line
    )


def test_2n_requests_through_two_planes_admit_about_n_and_the_leader_holds_it_whole_once_alone(
    ha: tuple[Cluster, str],
) -> None:
    cluster, limited = ha

    def standby_serves() -> bool:
        return post(cluster, "cp2", cluster.key)[0] == 200 and answered_here(cluster, "cp2") > 0

    wait_for(standby_serves, 30, "the standby serves /v1 itself")  # with the unlimited key

    answers = [post(cluster, name, limited)[0:2] for _ in range(PER_MINUTE) for name in ("cp1", "cp2")]
    admitted = sum(1 for status, _ in answers if status == 200)
    refused = [headers for status, headers in answers if status != 200]
    # each plane holds half the bucket (10); refills over the seconds the run takes add one or two
    assert PER_MINUTE - 1 <= admitted <= PER_MINUTE + 2, answers
    assert all(status in (200, 429) for status, _ in answers)
    assert refused and all(int(headers["retry-after"]) >= 1 for headers in refused)
    shared = [int(headers["x-ratelimit-limit-requests"]) for headers in refused]
    assert all(PER_MINUTE // 2 - 2 <= limit <= PER_MINUTE // 2 + 2 for limit in shared), shared

    cluster.kill(cluster.process_name("cp2"), signal.SIGTERM)

    def whole_on_cp1() -> bool:
        status, headers = post(cluster, "cp1", limited)
        return status == 429 and int(headers["x-ratelimit-limit-requests"]) == PER_MINUTE

    wait_for(whole_on_cp1, 10, "the leader holds the whole limit once the standby is gone")
