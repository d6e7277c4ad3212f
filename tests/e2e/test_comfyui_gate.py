"""A real control plane and agent serving a ComfyUI model: the agent starts the gate, the gate the stand-in.

The replica becomes READY once the gate answers its health check (ComfyUI
answering behind it), and the gate answers the ComfyUI API and
``/progress/{prompt_id}`` on the replica's port with the replica's key.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.config import ComfyuiSettings, EngineSettings
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.nvidia_smi_standin import H100_80G, install_fake_nvidia_smi
from llmgw.testing.standin_programs import write_standins

pytestmark = pytest.mark.e2e

MODEL = "comfy-picture"
WORKFLOW = {
    "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "flux1-schnell.safetensors"}},
    "3": {"class_type": "EmptyLatentImage", "inputs": {"width": 32, "height": 32, "batch_size": 1}},
    "4": {"class_type": "KSampler", "inputs": {"steps": 6, "model": ["1", 0], "latent_image": ["3", 0]}},
    "6": {"class_type": "SaveImage", "inputs": {"filename_prefix": "e2e", "images": ["4", 0]}},
}


@pytest.fixture(scope="module")
def comfy_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("comfyui")
    programs = write_standins(home / "standins")
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        blob = running.upload(filename="flux1-schnell.safetensors", data=b"\0" * 64)
        running.admin.request(
            "POST",
            "/api/models",
            {
                "name": MODEL,
                "source": {
                    "sha256": blob["sha256"],
                    "filename": "flux1-schnell.safetensors",
                    "format": "safetensors",
                },
                "profile": {"engine": "comfyui", "parallel": 1},
            },
        )
        running.add_node(
            "node1",
            nvidia_smi=str(install_fake_nvidia_smi(home / "smi", [H100_80G], driver_version="580.82.07")),
            engines=EngineSettings(
                comfyui=ComfyuiSettings(python=str(programs.python), main=str(programs.comfyui_main))
            ),
        )
        running.start_agent("node1")
        running.wait_ready(MODEL, 120)
        yield running


def call(port: int, key: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_comfyui_replica_is_ready_and_its_gate_answers_progress(comfy_cluster: Cluster) -> None:
    replica = comfy_cluster.wait_ready(MODEL)
    port = replica["port"]
    key = comfy_cluster.engine_key(port)
    assert call(port, "sk-wrong", "GET", "/queue")[0] == 401
    status, queued = call(port, key, "POST", "/prompt", {"prompt": WORKFLOW})
    assert status == 200, queued
    prompt_id = queued["prompt_id"]
    seen: list[dict[str, Any]] = []

    def done() -> bool:
        status, progress = call(port, key, "GET", f"/progress/{prompt_id}")
        assert status == 200, progress
        seen.append(progress)
        return bool(progress["state"] == "done")

    wait_for(done, 30, "the workflow is done", interval_s=0.05)
    assert seen[-1]["percent"] == 100.0 and seen[-1]["outputs"][0]["filename"].endswith(".png")
    status, history = call(port, key, "GET", f"/history/{prompt_id}")
    assert history[prompt_id]["prompt"][3]["client_id"].startswith("llmgw-gate-")
    assert call(port, key, "GET", "/system_stats")[0] == 404


def test_comfyui_sees_the_fetched_weights_under_their_own_name(comfy_cluster: Cluster) -> None:
    port = comfy_cluster.wait_ready(MODEL)["port"]
    linked = [
        path
        for path in Path(comfy_cluster.home, "nodes").rglob(
            "comfyui/models/checkpoints/flux1-schnell.safetensors"
        )
    ]
    assert linked and linked[0].read_bytes() == b"\0" * 64
    assert call(port, comfy_cluster.engine_key(port), "GET", "/health") == (200, {"status": "ok"})
