"""``http.metrics_address``: /metrics without a token on an address of its own, and not on the HTTP port."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from llmgw.controlplane.config import save_server_config
from llmgw.errors import LlmgwError
from llmgw.testing.cluster import Cluster, free_port, wait_for

pytestmark = pytest.mark.e2e


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_metrics_are_served_without_a_token_on_their_own_address_only(tmp_path: Path) -> None:
    with Cluster(tmp_path / "cluster", tmp_path / "cache") as cluster:
        address = f"127.0.0.1:{free_port()}"
        cluster.config.http.metrics_address = address
        save_server_config(cluster.config, cluster.home / "server.yaml")
        cluster.start_server()
        status, text = wait_for(lambda: get(f"http://{address}/metrics"), 10, "the metrics address answers")
        assert status == 200 and "llmgw_leader 1.0" in text
        assert get(f"http://{address}/api/status")[0] == 404
        status, text = get(f"{cluster.url}/metrics")
        assert status == 404 and f"http://{address}/metrics" in text
        with pytest.raises(LlmgwError, match="not served on this address"):  # whatever the token
            cluster.metrics()
