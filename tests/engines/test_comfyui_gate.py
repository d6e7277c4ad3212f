"""The ComfyUI gate against the ComfyUI stand-in: its key, its routes, its client id and /progress."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.engines.comfyui_gate import follow
from llmgw.engines.comfyui_progress import Progress
from llmgw.engines.comfyui_routes import Upstream, build_app
from llmgw.gateway import GatewaySettings, ReplicaEndpoint
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.gate import GateClient, missing_node
from llmgw.testing import comfyui_standin
from llmgw.testing.comfyui_standin_run import Runner, Settings
from llmgw.testing.eventually import eventually

from .conftest import Serve

KEY = "sk-replica-comfy"
AUTH = {"Authorization": f"Bearer {KEY}"}
STEP_S = 0.02


def workflow(steps: int = 5, text: str = "a red fox", *, fail: bool = False) -> dict[str, Any]:
    nodes: dict[str, Any] = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "model.safetensors"}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": text, "clip": ["1", 1]}},
        "3": {"class_type": "EmptyLatentImage", "inputs": {"width": 48, "height": 32, "batch_size": 1}},
        "4": {
            "class_type": "KSampler",
            "inputs": {"steps": steps, "model": ["1", 0], "positive": ["2", 0], "latent_image": ["3", 0]},
        },
        "5": {"class_type": "VAEDecode", "inputs": {"samples": ["4", 0], "vae": ["1", 2]}},
        "6": {"class_type": "SaveImage", "inputs": {"filename_prefix": "llmgw", "images": ["5", 0]}},
    }
    if fail:
        nodes["5"] = {
            "class_type": "StandinFail",
            "inputs": {"message": "out of memory", "samples": ["4", 0]},
        }
    return nodes


@dataclass
class Gated:
    url: str
    http: aiohttp.ClientSession
    upstream: Upstream
    runner: Runner

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] = AUTH
    ) -> tuple[int, Any]:
        async with self.http.request(method, self.url + path, json=body, headers=headers) as answer:
            data = await answer.read()
            kind = answer.headers.get("Content-Type", "")
            return answer.status, (await answer.json() if "json" in kind else data)

    async def queue(self, prompt: dict[str, Any], **extra: Any) -> str:
        status, answer = await self.call("POST", "/prompt", {"prompt": prompt, **extra})
        assert status == 200, answer
        return str(answer["prompt_id"])

    async def progress(self, prompt_id: str) -> dict[str, Any]:
        status, answer = await self.call("GET", f"/progress/{prompt_id}")
        assert status == 200, answer
        return dict(answer)


@pytest.fixture
async def gated(serve: Serve, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Gated]:
    """The gate before the stand-in; parametrized indirectly with False, a ComfyUI older than 0.3.57
    (its /interrupt interrupts whatever runs, prompt_id or not)."""
    directories = {kind: tmp_path / kind for kind in ("output", "temp", "input")}
    for directory in directories.values():
        directory.mkdir()
    by_id = getattr(request, "param", True)
    settings = Settings(base=tmp_path, directories=directories, step_s=STEP_S, interrupt_by_id=by_id)
    standin = comfyui_standin.build_app(settings)
    comfy_url = await serve(standin)
    async with aiohttp.ClientSession() as client, aiohttp.ClientSession() as http:
        upstream = Upstream(url=comfy_url, client_id="llmgw-gate-test")
        progress = Progress()
        follower = asyncio.create_task(follow(upstream, progress, client))
        url = await serve(build_app(KEY, upstream, client, progress, "flux-schnell"))
        gate = Gated(url, http, upstream, standin[comfyui_standin.RUNNER])
        await eventually(lambda: upstream.connected, message="the gate's websocket is open")
        yield gate
        follower.cancel()


async def test_every_route_demands_the_replica_key(gated: Gated) -> None:
    for headers in ({}, {"Authorization": "Bearer sk-other"}, {"Authorization": KEY}):
        status, answer = await gated.call("GET", "/health", headers=headers)
        assert status == 401
        assert "replica's key" in answer["error"]["message"]
    assert (await gated.call("GET", "/health"))[0] == 200
    status, models = await gated.call("GET", "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["flux-schnell"]


@pytest.mark.parametrize(
    ("method", "path", "status", "says"),
    [
        ("GET", "/system_stats", 404, "not served by this ComfyUI gate"),
        ("POST", "/upload/image", 404, "not served by this ComfyUI gate"),
        ("GET", "/object_info", 404, "it serves POST /prompt"),
        ("GET", "/ws", 404, "not served"),
        ("DELETE", "/prompt", 405, "DELETE is not taken on /prompt"),
        ("GET", "/interrupt", 405, "is not taken"),
    ],
)
async def test_only_the_allowed_routes_pass(
    gated: Gated, method: str, path: str, status: int, says: str
) -> None:
    got, answer = await gated.call(method, path)
    assert got == status
    assert says in answer["error"]["message"]


async def test_clearing_the_whole_queue_is_refused(gated: Gated) -> None:
    status, answer = await gated.call("POST", "/queue", {"clear": True})
    assert status == 400
    assert 'never "clear"' in answer["error"]["message"]


async def test_the_gate_puts_its_own_client_id_on_every_workflow(gated: Gated) -> None:
    prompt_id = await gated.queue(workflow(steps=1), client_id="someone-else")
    await eventually(lambda: prompt_id in gated.runner.history, timeout_s=10)
    _, history = await gated.call("GET", f"/history/{prompt_id}")
    assert history[prompt_id]["prompt"][3]["client_id"] == "llmgw-gate-test"


async def test_progress_goes_from_queued_to_running_to_done_with_steps_rising(gated: Gated) -> None:
    first = await gated.queue(workflow(steps=10))
    second = await gated.queue(workflow(steps=10, text="a blue bird"))
    seen = [await gated.progress(second)]
    assert seen[0]["state"] == "queued" and seen[0]["ahead"] >= 1
    while seen[-1]["state"] != "done":
        await asyncio.sleep(STEP_S / 2)
        seen.append(await gated.progress(second))
        assert len(seen) < 2000, seen[-1]
    states = [s["state"] for s in seen]
    assert states.index("queued") < states.index("running") < states.index("done")
    running = [s for s in seen if s["state"] == "running" and s["steps"]]
    steps = [s["step"] for s in running]
    assert steps == sorted(steps) and len(set(steps)) > 2, steps
    assert all(s["steps"] == 10 and s["node"] == "4" for s in running)
    assert [s["percent"] for s in running] == sorted(s["percent"] for s in running)
    done = seen[-1]
    assert done["percent"] == 100.0 and done["error"] is None
    assert [o["filename"].endswith(".png") for o in done["outputs"]] == [True]
    status, picture = await gated.call(
        "GET", "/view?" + "&".join(f"{k}={v}" for k, v in done["outputs"][0].items())
    )
    assert status == 200 and picture.startswith(b"\x89PNG")
    assert (await gated.progress(first))["state"] == "done"


async def test_an_interrupted_workflow_is_failed_as_interrupted(gated: Gated) -> None:
    prompt_id = await gated.queue(workflow(steps=500))

    async def stepping() -> bool:
        return (await gated.progress(prompt_id))["step"] > 0

    await eventually(stepping, timeout_s=10)
    status, _ = await gated.call("POST", "/interrupt", {"prompt_id": prompt_id})
    assert status == 200

    async def ended() -> dict[str, Any] | None:
        state = await gated.progress(prompt_id)
        return state if state["state"] == "failed" else None

    assert (await eventually(ended, timeout_s=10))["error"] == "interrupted"


async def test_a_workflow_deleted_from_the_queue_never_runs(gated: Gated) -> None:
    running = await gated.queue(workflow(steps=100))
    waiting = await gated.queue(workflow(steps=1))
    status, _ = await gated.call("POST", "/queue", {"delete": [waiting]})
    assert status == 200
    state = await gated.progress(waiting)
    assert state["state"] == "failed" and state["error"] == "cancelled before it ran"
    await gated.call("POST", "/interrupt", {"prompt_id": running})
    await eventually(lambda: running in gated.runner.history, timeout_s=10)
    assert waiting not in gated.runner.history and not gated.runner.pending


async def test_a_failing_node_fails_the_workflow_with_why(gated: Gated) -> None:
    prompt_id = await gated.queue(workflow(steps=1, fail=True))

    async def ended() -> dict[str, Any] | None:
        state = await gated.progress(prompt_id)
        return state if state["state"] == "failed" else None

    failed = await eventually(ended, timeout_s=10)
    assert "StandinFail (node 5) failed: out of memory" == failed["error"]


async def test_an_unknown_prompt_has_no_progress(gated: Gated) -> None:
    status, answer = await gated.call("GET", "/progress/nothing-such")
    assert status == 404 and "no workflow nothing-such" in answer["error"]["message"]


async def test_the_gate_connects_again_when_its_websocket_drops(gated: Gated) -> None:
    for ws in list(gated.runner.sockets.values()):
        await ws.close()
    await eventually(lambda: not gated.upstream.connected, message="the gate saw the websocket close")
    await eventually(lambda: "llmgw-gate-test" in gated.runner.sockets, timeout_s=10, message="reconnected")
    prompt_id = await gated.queue(workflow(steps=2))

    async def done() -> bool:
        return (await gated.progress(prompt_id))["state"] == "done"

    await eventually(done, timeout_s=10)


async def test_bad_bodies_are_refused_with_what_to_send(gated: Gated) -> None:
    status, answer = await gated.call("POST", "/prompt", {"workflow": {}})
    assert status == 400 and 'give {"prompt"' in answer["error"]["message"]
    status, answer = await gated.call("POST", "/prompt", {"prompt": {"1": {"inputs": {}}}})
    assert status == 400 and answer["error"]["type"] == "invalid_prompt"  # ComfyUI's own, passed on


async def test_deleting_a_running_workflow_from_the_queue_leaves_it_running(gated: Gated) -> None:
    prompt_id = await gated.queue(workflow(steps=500))

    async def stepping() -> bool:
        return (await gated.progress(prompt_id))["step"] > 0

    await eventually(stepping, timeout_s=10)
    assert (await gated.call("POST", "/queue", {"delete": [prompt_id]}))[0] == 200
    state = await gated.progress(prompt_id)
    assert state["state"] == "running" and state["error"] is None
    await gated.call("POST", "/interrupt", {"prompt_id": prompt_id})


async def running_and_waiting(gated: Gated) -> tuple[str, str]:
    """Two workflows queued through the gate: the first stepping, the second waiting behind it."""
    running = await gated.queue(workflow(steps=500))
    waiting = await gated.queue(workflow(steps=1, text="another tenant"))

    async def stepping() -> bool:
        return (await gated.progress(running))["step"] > 0

    await eventually(stepping, timeout_s=10)
    return running, waiting


@pytest.mark.parametrize("gated", [True, False], indirect=True, ids=["comfyui-0.3.57+", "older-comfyui"])
async def test_cancelling_a_waiting_workflow_takes_it_off_the_queue_and_never_interrupts_the_running_one(
    gated: Gated,
) -> None:
    running, waiting = await running_and_waiting(gated)
    status, answer = await gated.call("POST", "/interrupt", {"prompt_id": waiting})
    assert not gated.runner.interrupted and gated.runner.running_ids() == {running}
    assert waiting not in {item[1] for item in gated.runner.pending}
    assert (await gated.progress(waiting))["error"] == "cancelled before it ran"
    assert status == 200 and answer == {"prompt_id": waiting, "interrupted": False, "deleted": True}
    steps = (await gated.progress(running))["step"]

    async def stepped_on() -> bool:
        return (await gated.progress(running))["step"] > steps

    await eventually(stepped_on, timeout_s=10, message="the running workflow goes on")
    assert (await gated.progress(running))["state"] == "running"


@pytest.mark.parametrize("gated", [True, False], indirect=True, ids=["comfyui-0.3.57+", "older-comfyui"])
async def test_cancelling_a_finished_workflow_interrupts_nothing(gated: Gated) -> None:
    finished = await gated.queue(workflow(steps=1))
    await eventually(lambda: finished in gated.runner.history, timeout_s=10)
    running, _ = await running_and_waiting(gated)
    status, answer = await gated.call("POST", "/interrupt", {"prompt_id": finished})
    assert not gated.runner.interrupted and gated.runner.running_ids() == {running}
    assert status == 200 and answer == {"prompt_id": finished, "interrupted": False, "deleted": False}


@pytest.mark.parametrize("gated", [True, False], indirect=True, ids=["comfyui-0.3.57+", "older-comfyui"])
async def test_cancelling_the_running_workflow_interrupts_it(gated: Gated) -> None:
    running, waiting = await running_and_waiting(gated)
    status, answer = await gated.call("POST", "/interrupt", {"prompt_id": running})
    assert status == 200 and answer == {"prompt_id": running, "interrupted": True, "deleted": False}

    async def ended() -> dict[str, Any] | None:
        state = await gated.progress(running)
        return state if state["state"] == "failed" else None

    assert (await eventually(ended, timeout_s=10))["error"] == "interrupted"
    await eventually(lambda: waiting in gated.runner.history, timeout_s=10, message="the next one ran")
    assert gated.runner.history[waiting]["status"]["status_str"] == "success"


async def test_an_interrupt_naming_no_workflow_is_refused(gated: Gated) -> None:
    running, _ = await running_and_waiting(gated)
    for body in ({}, {"prompt_id": ""}, None):
        status, answer = await gated.call("POST", "/interrupt", body)
        assert status == 400 and 'give {"prompt_id": ID}' in answer["error"]["message"]
    assert not gated.runner.interrupted and gated.runner.running_ids() == {running}


async def test_a_workflow_needing_a_custom_node_the_replica_lacks_fails_naming_the_node(gated: Gated) -> None:
    """The gateway's own client through the gate: ComfyUI's refusal of an unknown class becomes the
    gateway's "custom node missing" error, which says what to add, not a complaint about the inputs."""
    client = GateClient(GatewaySettings())
    endpoint = ReplicaEndpoint("r-comfy", "flux-schnell", gated.url, KEY, engine="comfyui")
    graph = workflow(steps=1)
    graph["5"] = {"class_type": "FaceDetailer", "inputs": {"image": ["4", 0]}}
    try:
        with pytest.raises(ApiError) as refused:
            await client.queue(endpoint, graph)
        assert refused.value.status == 502 and refused.value.code == "custom_node_missing"
        assert "no node class 'FaceDetailer' (node 5" in refused.value.message
        assert "comfyui.nodes" in refused.value.message
        assert not gated.runner.pending and not gated.runner.running
        assert await client.queue(endpoint, workflow(steps=1))  # a workflow of known classes queues
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("error", "found"),
    [
        (  # ComfyUI since its PR #12194 (January 2026)
            {"type": "missing_node_type", "message": "Node 'Fix faces' not found. The custom node may not be "
             "installed.", "details": "Node ID '#5'",
             "extra_info": {"node_id": "5", "class_type": "FaceDetailer", "node_title": "Fix faces"}},
            ("FaceDetailer", "5"),
        ),
        (  # ComfyUI 0.3.64's execution.py
            {"type": "invalid_prompt", "message": "Cannot execute because node FaceDetailer does not exist.",
             "details": "Node ID '#5'", "extra_info": {}},
            ("FaceDetailer", "5"),
        ),
        (
            {"type": "missing_node_type", "message": "Node 'ID #7' has no class_type.",
             "details": "Node ID '#7'",
             "extra_info": {"node_id": "7", "class_type": None, "node_title": None}},
            None,
        ),
        ({"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation"}, None),
    ],
)  # fmt: skip
def test_a_refusal_names_a_missing_node_in_either_of_comfyuis_shapes(
    error: dict[str, Any], found: tuple[str, str] | None
) -> None:
    assert missing_node({"error": error, "node_errors": {}}) == found
