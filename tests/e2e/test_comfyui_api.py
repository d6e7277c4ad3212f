"""Pictures and jobs through a real cluster: gateway, agent, gate and the ComfyUI stand-in.

A picture made with the openai SDK's ``images.generate``; a mesh job polled
from queued to 100 % with its progress rising, returning a GLB whose vertex
colours trimesh reads back; another key can neither read nor cancel the job, and
a key of another place cannot read its file;
two members of one environment served by one replica.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import trimesh
from openai import OpenAI

from llmgw.agent.config import ComfyuiSettings, EngineSettings
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.nvidia_smi_standin import H100_80G, install_fake_nvidia_smi
from llmgw.testing.standin_programs import write_standins

pytestmark = pytest.mark.e2e

PICTURES = "e2e-pictures"
MESHES = "e2e-meshes"
MEMBERS = ("duo-a", "duo-b")
PICTURE_WORKFLOW = {
    "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "pictures.safetensors"}},
    "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["1", 1]}},
    "3": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
    "4": {
        "class_type": "KSampler",
        "inputs": {"seed": 0, "steps": 4, "model": ["1", 0], "positive": ["2", 0], "latent_image": ["3", 0]},
    },
    "6": {"class_type": "SaveImage", "inputs": {"filename_prefix": "e2e", "images": ["4", 0]}},
}
PICTURE_INPUTS = {
    "prompt": {"node": "2", "input": "text"},
    "width": {"node": "3", "input": "width"},
    "height": {"node": "3", "input": "height"},
    "seed": {"node": "4", "input": "seed"},
}
MESH_WORKFLOW = {
    "1": {"class_type": "LoadImage", "inputs": {"image": "input.png"}},
    "2": {"class_type": "KSampler", "inputs": {"steps": 80, "latent_image": ["1", 0]}},
    "3": {"class_type": "TripoSRViewer", "inputs": {"mesh": ["2", 0]}},
}
"""80 steps of 0.05 s: four seconds in which the router reads the progress several times."""


def _model(
    cluster: Cluster, name: str, workflow: dict[str, Any], inputs: dict[str, Any], **section: Any
) -> None:
    filename = f"{name}.safetensors"
    blob = cluster.upload(filename=filename, data=name.encode() * 8)
    cluster.admin.request(
        "POST",
        "/api/models",
        {
            "name": name,
            "source": {"sha256": blob["sha256"], "filename": filename, "format": "safetensors"},
            "profile": {"engine": "comfyui", "parallel": 1},
            "comfyui": {"workflow": workflow, "inputs": inputs, **section},
        },
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("comfyapi")
    programs = write_standins(home / "standins")
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        _model(running, PICTURES, PICTURE_WORKFLOW, PICTURE_INPUTS, outputs="image", licence="Apache-2.0")
        _model(
            running,
            MESHES,
            MESH_WORKFLOW,
            {"image": {"node": "1", "input": "image"}},
            outputs="mesh",
            licence="MIT (TripoSR)",
        )
        for member in MEMBERS:
            _model(running, member, PICTURE_WORKFLOW, PICTURE_INPUTS, environment="duo")
        cards = [H100_80G] * 3
        running.add_node(
            "node1",
            nvidia_smi=str(install_fake_nvidia_smi(home / "smi", cards, driver_version="580.82.07")),
            engines=EngineSettings(
                comfyui=ComfyuiSettings(python=str(programs.python), main=str(programs.comfyui_main))
            ),
        )
        running.start_agent("node1")
        running.wait_ready(PICTURES, 120)
        running.wait_ready(MESHES, 120)
        yield running


def _call(cluster: Cluster, key: str, method: str, path: str, body: Any = None) -> tuple[int, Any, bytes]:
    request = urllib.request.Request(
        cluster.url + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            raw = answer.read()
            kind = answer.headers.get("Content-Type", "")
            return answer.status, json.loads(raw) if kind.startswith("application/json") else None, raw
    except urllib.error.HTTPError as error:
        raw = error.read()
        return error.code, json.loads(raw), raw


def _project_key(cluster: Cluster, name: str) -> str:
    """A key of a project of its own (acme/art/NAME): a place apart, whose keys read no other's files."""
    admin = cluster.admin
    orgs = {o["name"] for o in admin.get("/api/orgs")}
    if "acme" not in orgs:
        admin.request("POST", "/api/orgs", {"name": "acme"})
        admin.request("POST", "/api/teams", {"org": "acme", "name": "art"})
    admin.request("POST", "/api/projects", {"org": "acme", "team": "art", "name": name})
    made = admin.request("POST", "/api/keys", {"name": name, "place": f"project:acme/art/{name}"})
    return str(made["key"])


def test_a_picture_from_the_openai_sdk(cluster: Cluster) -> None:
    key = cluster.create_key("pictures")
    client = OpenAI(base_url=f"{cluster.url}/v1", api_key=key, max_retries=0, timeout=60)
    answer = client.images.generate(
        model=PICTURES,
        prompt="a red fox",
        size="128x96",
        response_format="b64_json",  # type: ignore[arg-type]
    )
    assert answer.data is not None
    png = base64.b64decode(answer.data[0].b64_json or "")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert struct.unpack(">II", png[16:24]) == (128, 96), "the size went into the workflow"
    by_url = client.images.generate(model=PICTURES, prompt="a red fox", response_format="url")
    assert by_url.data is not None and by_url.data[0].url is not None
    status, _, raw = _call(cluster, key, "GET", by_url.data[0].url.removeprefix(cluster.url))
    assert status == 200 and raw.startswith(b"\x89PNG")


def test_a_mesh_job_rises_to_100_percent_and_returns_a_coloured_glb_only_to_its_key(cluster: Cluster) -> None:
    alice, bob = cluster.create_key("alice"), _project_key(cluster, "bob")
    status, created, _ = _call(
        cluster, alice, "POST", "/v1/jobs", {"model": MESHES, "inputs": {"image": "fox.png"}}
    )
    assert status == 202 and created["state"] == "queued", created
    job = created["id"]
    seen: list[dict[str, Any]] = []

    def done() -> bool:
        status, state, _ = _call(cluster, alice, "GET", f"/v1/jobs/{job}")
        assert status == 200, state
        seen.append(state)
        assert state["state"] not in ("failed", "cancelled"), state
        return bool(state["state"] == "done")

    wait_for(done, 60, "the mesh job is done", interval_s=0.1)
    assert seen[0]["state"] in ("queued", "running")
    running = [s["percent"] for s in seen if s["state"] == "running"]
    assert len(set(running)) >= 2, f"the progress was read while it ran: {seen}"
    # ComfyUI's last step reports its maximum before the run ends (executed, then execution_success):
    # a job may read 100 % an instant while it still runs
    assert running == sorted(running) and 0 < running[-1] <= 100
    assert seen[-1]["percent"] == 100.0
    (file,) = seen[-1]["files"]
    assert file["filename"].endswith(".glb")
    for method in ("GET", "DELETE"):
        assert _call(cluster, bob, method, f"/v1/jobs/{job}")[0] == 404
    assert _call(cluster, bob, "GET", file["url"].removeprefix(cluster.url))[0] == 404
    status, _, glb = _call(cluster, alice, "GET", file["url"].removeprefix(cluster.url))
    assert status == 200
    mesh = trimesh.load(io.BytesIO(glb), file_type="glb", force="mesh", process=False)
    assert mesh.visual.kind == "vertex" and len(mesh.visual.vertex_colors) == len(mesh.vertices) > 0
    (length,) = struct.unpack_from("<I", glb, 12)
    assert json.loads(glb[20 : 20 + length])["asset"]["copyright"] == "MIT (TripoSR)"


def test_cancelling_a_running_job_interrupts_it(cluster: Cluster) -> None:
    key = cluster.create_key("canceller")
    _, created, _ = _call(cluster, key, "POST", "/v1/jobs", {"model": MESHES, "inputs": {"image": "fox.png"}})
    job = created["id"]
    wait_for(
        lambda: _call(cluster, key, "GET", f"/v1/jobs/{job}")[1]["state"] == "running",
        30,
        "the job runs",
        0.05,
    )
    status, cancelled, _ = _call(cluster, key, "DELETE", f"/v1/jobs/{job}")
    assert status == 200 and cancelled["state"] == "cancelled"
    again = cluster.create_key("after")
    started = time.monotonic()
    _, next_job, _ = _call(
        cluster, again, "POST", "/v1/jobs", {"model": MESHES, "inputs": {"image": "b.png"}}
    )
    wait_for(
        lambda: _call(cluster, again, "GET", f"/v1/jobs/{next_job['id']}")[1]["state"] == "running",
        30,
        "the next job runs at once: the cancelled one no longer holds ComfyUI",
        0.05,
    )
    assert time.monotonic() - started < 3.5


def test_two_members_of_one_environment_are_served_by_one_replica(cluster: Cluster) -> None:
    key = cluster.create_key("members")
    client = OpenAI(base_url=f"{cluster.url}/v1", api_key=key, max_retries=0, timeout=120)
    for member in MEMBERS:
        answer = client.images.generate(model=member, prompt="a fox", response_format="b64_json")
        assert answer.data is not None and base64.b64decode(answer.data[0].b64_json or "").startswith(
            b"\x89PNG"
        )
    replicas = [r for r in cluster.admin.get("/api/replicas") if r["model"] in (*MEMBERS, "comfyui-env-duo")]
    assert [r["model"] for r in replicas] == ["comfyui-env-duo"], replicas
