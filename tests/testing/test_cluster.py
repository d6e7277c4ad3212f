"""The test kit's Cluster as a context manager: what it started is stopped when the block ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.testing.cluster import Cluster


def test_a_failing_block_still_stops_every_process_the_cluster_started(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="the test failed"),
        Cluster(tmp_path / "cluster", tmp_path) as cluster,
    ):
        started = [
            cluster.start(name, "--bind", "127.0.0.1", "0", module="http.server") for name in ("one", "two")
        ]
        assert all(process.poll() is None for process in started)
        raise RuntimeError("the test failed")
    assert [process.poll() is not None for process in started] == [True, True]
    assert cluster.processes == {}


def test_the_block_gets_the_cluster_and_leaves_it_stopped(tmp_path: Path) -> None:
    with Cluster(tmp_path / "cluster", tmp_path) as cluster:
        process = cluster.start("server", "--bind", "127.0.0.1", "0", module="http.server")
    assert process.poll() is not None and cluster.processes == {}
