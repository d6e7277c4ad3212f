"""What a client made holds across processes and a failover, with real processes: two control planes on
PostgreSQL, one agent running llama-server with SmolLM2, another the ComfyUI stand-in on stand-in GPUs.

A Responses follow-up sent to the standby continues a response the leader answered; a ComfyUI job taken by
the leader is polled through the standby while it runs, and after kill -9 of the leader the new leader
takes it over from its prompt id: the client, polling the standby throughout, sees it end done with its
file, which it reads through the standby. The tests run in this file's order; the last kills the leader.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.agent.config import ComfyuiSettings, EngineSettings
from llmgw.cli.up import DEFAULT_MODEL
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.nvidia_smi_standin import H100_80G, install_fake_nvidia_smi
from llmgw.testing.postgres import PostgresServer
from llmgw.testing.standin_programs import write_standins

pytestmark = pytest.mark.e2e

CHAT = DEFAULT_MODEL
MESHES = "failover-meshes"
LEASE_S = 5.0
MESH_WORKFLOW = {
    "1": {"class_type": "LoadImage", "inputs": {"image": "input.png"}},
    "2": {"class_type": "KSampler", "inputs": {"steps": 500, "latent_image": ["1", 0]}},
    "3": {"class_type": "TripoSRViewer", "inputs": {"mesh": ["2", 0]}},
}
"""500 steps of 0.05 s: 25 seconds, long enough to kill the leader in the middle and take the job over."""


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("client-state")
    programs = write_standins(home / "standins")
    with PostgresServer.start() as database:
        with Cluster(home / "cluster", engine_cache, store_url=database.url, lease_s=LEASE_S) as cluster:
            cluster.start_leader_and_standby(20)
            cluster.add_model(CHAT, model_file, {"ctx_size": 2048, "parallel": 2})
            blob = cluster.upload(filename="mesh.safetensors", data=b"mesh weights " * 8)
            cluster.admin.request(
                "POST",
                "/api/models",
                {
                    "name": MESHES,
                    "source": {
                        "sha256": blob["sha256"],
                        "filename": "mesh.safetensors",
                        "format": "safetensors",
                    },
                    "profile": {"engine": "comfyui", "parallel": 1, "gpu_class": "h100-80g"},
                    "comfyui": {
                        "workflow": MESH_WORKFLOW,
                        "inputs": {"image": {"node": "1", "input": "image"}},
                        "outputs": "mesh",
                        "licence": "MIT (TripoSR)",
                    },
                },
            )
            cluster.create_key("tests")
            cluster.add_node("node1")
            cluster.add_node(
                "gpu1",
                nvidia_smi=str(install_fake_nvidia_smi(home / "smi", [H100_80G])),
                engines=EngineSettings(
                    comfyui=ComfyuiSettings(python=str(programs.python), main=str(programs.comfyui_main))
                ),
            )
            cluster.start_agent("node1")  # first: SmolLM2 runs on the CPU build, which node1 has
            cluster.wait_ready(CHAT, 180)
            cluster.start_agent("gpu1")
            cluster.wait_ready(MESHES, 120)
            yield cluster


def call(cluster: Cluster, plane: str, method: str, path: str, body: Any = None) -> tuple[int, Any, bytes]:
    request = urllib.request.Request(
        cluster.url_of(plane) + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {cluster.key}", "Content-Type": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            raw = answer.read()
            kind = answer.headers.get("Content-Type", "")
            return answer.status, json.loads(raw) if kind.startswith("application/json") else None, raw
    except urllib.error.HTTPError as error:
        raw = error.read()
        return error.code, json.loads(raw) if raw.startswith(b"{") else None, raw
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
        return 0, None, str(error).encode()


def sdk(cluster: Cluster, plane: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{cluster.url_of(plane)}/v1", api_key=cluster.key, max_retries=0, timeout=30
    )


def test_a_responses_follow_up_on_the_standby_continues_the_leader_s_response(ha: Cluster) -> None:
    wait_for(lambda: sdk(ha, "cp2").models.list().data or None, 20, "cp2 serves /v1")
    first = sdk(ha, "cp1").responses.create(model=CHAT, input="My name is Ada.", max_output_tokens=8)
    follow_up = sdk(ha, "cp2").responses.create(
        model=CHAT, input="What is my name?", previous_response_id=first.id, max_output_tokens=8
    )
    assert follow_up.id != first.id and follow_up.output_text
    assert sdk(ha, "cp2").responses.retrieve(first.id).id == first.id
    items = [item.id for item in sdk(ha, "cp2").responses.input_items.list(follow_up.id)]
    assert len(items) >= 3, "the follow-up's input holds the first turn, its answer and its own"


def test_a_job_polled_through_the_standby_survives_kill_9_of_the_leader(ha: Cluster, tmp_path: Path) -> None:
    status, created, raw = call(
        ha, "cp1", "POST", "/v1/jobs", {"model": MESHES, "inputs": {"image": "fox.png"}}
    )
    assert status == 202, raw
    job = created["id"]

    def running_at(step: int) -> dict[str, Any] | None:
        status, state, _ = call(ha, "cp2", "GET", f"/v1/jobs/{job}")
        assert status == 200, state
        return state if state["state"] == "running" and state["step"] >= step else None

    before = wait_for(lambda: running_at(20), 30, "the standby shows the job running", 0.2)
    ha.kill(ha.process_name("cp1"), signal.SIGKILL)
    killed = time.monotonic()
    seen: list[dict[str, Any]] = []

    def done() -> dict[str, Any] | None:
        status, state, _ = call(ha, "cp2", "GET", f"/v1/jobs/{job}")
        if status != 200:
            return None  # the standby between two roles: asked again
        seen.append(state)
        assert state["state"] not in ("failed", "cancelled"), state
        return state if state["state"] == "done" else None

    finished = wait_for(done, 90, "the job ends done after the failover", 0.5)
    took_s = time.monotonic() - killed
    assert max(s["step"] for s in seen) >= before["step"], "it went on from where it was, not from 0"
    (made,) = finished["files"]
    assert made["filename"].endswith(".glb")
    status, _, glb = call(ha, "cp2", "GET", "/v1" + made["url"].split("/v1", 1)[1])
    assert status == 200 and glb[:4] == b"glTF", (status, glb[:100])
    print(f"\njob taken over and done {took_s:.1f} s after kill -9 of the leader")
