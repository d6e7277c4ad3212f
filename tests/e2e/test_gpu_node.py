"""A real agent on a node whose nvidia-smi is the stand-in: MIG instances reach the control plane."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.nvidia_smi_standin import (
    A100_80G_MIG,
    A100_80G_MIG_EMPTY,
    H100_80G,
    install_fake_nvidia_smi,
)


@pytest.fixture
def gpu_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path / "cluster", tmp_path / "cache") as running:
        running.start_server()
        yield running


def test_an_agent_registers_mig_instances_by_their_numbers(gpu_cluster: Cluster, tmp_path: Path) -> None:
    script = install_fake_nvidia_smi(tmp_path / "bin", [H100_80G, A100_80G_MIG, A100_80G_MIG_EMPTY])
    gpu_cluster.add_node("gpu1", nvidia_smi=str(script))
    gpu_cluster.start_agent("gpu1")

    def registered() -> list[dict[str, Any]] | None:
        nodes = {n["id"]: n for n in gpu_cluster.admin.get("/api/nodes")}
        node = nodes.get("gpu1")
        return node["gpus"] if node and node["connected"] else None

    gpus = wait_for(registered, 60, "the GPU node registers")

    assert [(g["index"], g["class"]) for g in gpus] == [
        (0, "h100-80g"),
        (1100, "a100-80g-mig-3g.40gb"),
        (1101, "a100-80g-mig-2g.20gb"),
        (1102, "a100-80g-mig-1g.10gb"),
        (2, "a100-80g"),
    ]
