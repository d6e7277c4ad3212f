"""Pictures and jobs through the real gateway (uvicorn) to a fake gate, with the openai SDK and raw HTTP."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import openai
import pytest
import trimesh
from openai import AsyncOpenAI

from llmgw.core.catalog import ModelDefinition, parse_model
from llmgw.core.engines import Task
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, hash_secret
from llmgw.gateway.catalog_view import catalog_entries
from llmgw.testing.comfyui_models import comfyui_model
from llmgw.testing.eventually import eventually
from llmgw.testing.serving import serving

from .conftest import RecordingOutbound
from .fake_gate import COLOURED_OBJ, FakeGate, tiny_png

ALICE = "sk-llmgw-alice-0123456789"
BOB = "sk-llmgw-bob-0123456789"
PICTURES = "pictures"
MESHES = "meshes"
CHAT = "chatty"

PICTURE_SECTION = {
    "workflow": {
        "3": {"class_type": "KSampler", "inputs": {"seed": 0, "steps": 4, "model": ["4", 0]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 1024, "height": 1024, "batch_size": 1}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "pic", "images": ["8", 0]}},
    },
    "inputs": {
        "prompt": {"node": "6", "input": "text"},
        "width": {"node": "5", "input": "width"},
        "height": {"node": "5", "input": "height"},
        "seed": {"node": "3", "input": "seed"},
    },
    "outputs": "image",
    "licence": "Apache-2.0",
}
MESH_SECTION = {
    "workflow": {
        "1": {"class_type": "LoadImage", "inputs": {"image": "example.png"}},
        "2": {"class_type": "TripoSRSampler", "inputs": {"image": ["1", 0], "resolution": 256}},
        "3": {"class_type": "SaveOBJ", "inputs": {"mesh": ["2", 0], "filename_prefix": "mesh"}},
    },
    "inputs": {"image": {"node": "1", "input": "image"}, "resolution": {"node": "2", "input": "resolution"}},
    "outputs": "mesh",
    "licence": "MIT (TripoSR)",
}


def _model(name: str, section: dict[str, Any], filename: str = "model.safetensors") -> ModelDefinition:
    return parse_model(comfyui_model(name, "a" * 64, filename=filename, comfyui=section))


def _key(key_id: str, secret: str, user: str) -> KeyEntry:
    return KeyEntry(key_id, key_id, hash_secret(secret), f"user:{user}", Place(Owner.parse(f"user:{user}")))


@pytest.fixture
async def gates() -> AsyncIterator[tuple[FakeGate, FakeGate]]:
    pictures = FakeGate(key="pictures-key", replica_id="p1", model=PICTURES, finish_at_once=True)
    meshes = FakeGate(
        key="meshes-key", replica_id="m1", model=MESHES, saves={"mesh_00001_.obj": COLOURED_OBJ}
    )
    await pictures.start()
    await meshes.start()
    yield pictures, meshes
    await pictures.stop()
    await meshes.stop()


@pytest.fixture
async def gw(
    request: pytest.FixtureRequest, gates: tuple[FakeGate, FakeGate], hooks: RecordingOutbound
) -> AsyncIterator[Gateway]:
    wait_s = getattr(request, "param", 0.3)  # how long requests wait for a replica
    gateway = Gateway(GatewaySettings(request_wait_s=wait_s, job_poll_s=0.01), outbound=hooks)
    gateway.keys.replace([_key("key-alice", ALICE, "alice"), _key("key-bob", BOB, "bob")])
    models = [_model(PICTURES, PICTURE_SECTION), _model(MESHES, MESH_SECTION)]
    gateway.catalog.replace([*catalog_entries(models), ModelEntry(CHAT, serves=Task.CHAT)])
    for gate in gates:
        gateway.feed.replica_ready(gate.endpoint)
    yield gateway
    await gateway.close()


@pytest.fixture
async def url(gw: Gateway) -> AsyncIterator[str]:
    async with serving(gw.asgi_app()) as base:
        yield base


@pytest.fixture
async def sdk(url: str) -> AsyncIterator[AsyncOpenAI]:
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=ALICE, max_retries=0, timeout=10)
    yield client
    await client.close()


@pytest.fixture
async def alice(url: str) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {ALICE}"}) as session:
        yield session


@pytest.fixture
async def bob(url: str) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {BOB}"}) as session:
        yield session


# -- the images API --------------------------------------------------------------------------------


async def test_images_b64_from_the_sdk_put_prompt_size_and_seed_into_the_workflow(
    sdk: AsyncOpenAI, gates: tuple[FakeGate, FakeGate], hooks: RecordingOutbound
) -> None:
    pictures, _ = gates
    answer = await sdk.images.generate(
        model=PICTURES,
        prompt="a red fox in snow",
        n=2,
        size="512x768",  # type: ignore[arg-type]  # any WxH the workflow takes
        response_format="b64_json",
        extra_body={"seed": 7},
    )
    assert answer.data is not None and len(answer.data) == 2
    assert all(base64.b64decode(image.b64_json or "") == tiny_png() for image in answer.data)
    graphs = list(pictures.prompts.values())
    assert [g["6"]["inputs"]["text"] for g in graphs] == ["a red fox in snow"] * 2
    assert {(g["5"]["inputs"]["width"], g["5"]["inputs"]["height"]) for g in graphs} == {(512, 768)}
    assert sorted(g["3"]["inputs"]["seed"] for g in graphs) == [7, 8]
    assert graphs[0]["3"]["inputs"]["model"] == ["4", 0], "the rest of the workflow is left as it was"
    await eventually(lambda: hooks.records)
    (record,) = hooks.records
    assert (record.model, record.key_id, record.replica_id) == (PICTURES, "key-alice", "p1")
    assert (record.completion_tokens, record.status) == (2, 200)
    assert pictures.unauthorised == 0


async def test_images_url_is_the_gateways_own_file_readable_by_the_same_key_only(
    sdk: AsyncOpenAI, alice: aiohttp.ClientSession, bob: aiohttp.ClientSession
) -> None:
    answer = await sdk.images.generate(model=PICTURES, prompt="a fox", response_format="url")
    assert answer.data is not None
    (image,) = answer.data
    assert image.url is not None and "/v1/files/file-" in image.url
    async with alice.get(image.url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "image/png"
        assert await response.read() == tiny_png()
    async with bob.get(image.url) as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "file_not_found"


async def test_images_refuse_bad_input_with_400s_naming_it(sdk: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad_size:
        await sdk.images.generate(model=PICTURES, prompt="a fox", size="huge")  # type: ignore[arg-type]
    assert bad_size.value.body is not None and "WIDTHxHEIGHT" in str(bad_size.value.body)
    with pytest.raises(openai.BadRequestError) as chat:
        await sdk.images.generate(model=CHAT, prompt="a fox")
    assert "serves chat" in chat.value.message and "/v1/chat/completions" in chat.value.message
    with pytest.raises(openai.BadRequestError) as mesh:
        await sdk.images.generate(model=MESHES, prompt="a fox")
    assert "serves jobs" in mesh.value.message
    with pytest.raises(openai.BadRequestError) as format_:
        await sdk.images.generate(model=PICTURES, prompt="a fox", response_format="gif")  # type: ignore[arg-type]
    assert "response_format" in format_.value.message
    with pytest.raises(openai.NotFoundError):
        await sdk.images.generate(model="nobody-has-this", prompt="a fox")


async def test_a_workflow_the_replica_refuses_is_a_400_with_its_reason(
    sdk: AsyncOpenAI, gates: tuple[FakeGate, FakeGate]
) -> None:
    pictures, _ = gates
    pictures.refuse = {
        "error": {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation"},
        "node_errors": {"5": {"errors": [{"message": "Value not in list", "details": "width: 7"}]}},
    }
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.images.generate(model=PICTURES, prompt="a fox")
    assert "node 5: Value not in list" in refused.value.message


# -- jobs ------------------------------------------------------------------------------------------


async def _job_state(session: aiohttp.ClientSession, job_id: str) -> dict[str, Any]:
    async with session.get(f"/v1/jobs/{job_id}") as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


async def _submit(session: aiohttp.ClientSession, gate: FakeGate, inputs: dict[str, Any]) -> tuple[str, str]:
    """A mesh job queued on ``gate``: (job id, prompt id)."""
    async with session.post("/v1/jobs", json={"model": MESHES, "inputs": inputs}) as response:
        assert response.status == 202, await response.text()
        created = await response.json()
    assert created["state"] == "queued" and created["object"] == "job"
    await eventually(lambda: gate.prompts)
    return created["id"], list(gate.prompts)[-1]


async def test_a_mesh_job_goes_queued_running_rising_done_and_returns_a_coloured_glb(
    alice: aiohttp.ClientSession, gates: tuple[FakeGate, FakeGate], hooks: RecordingOutbound
) -> None:
    _, meshes = gates
    job_id, prompt_id = await _submit(alice, meshes, {"image": "fox.png", "resolution": 320})
    assert meshes.prompts[prompt_id]["1"]["inputs"]["image"] == "fox.png"
    assert meshes.prompts[prompt_id]["2"]["inputs"]["resolution"] == 320

    meshes.set(prompt_id, "queued", ahead=2)
    queued = await eventually(lambda: _ahead(alice, job_id, 2))
    assert queued["state"] == "queued"
    seen = []
    for step in (1, 2, 3):
        meshes.set(prompt_id, "running", node="2", step=step, steps=4, percent=step * 25.0)
        running = await eventually(lambda step=step: _at_step(alice, job_id, step))  # type: ignore[misc]
        assert (running["state"], running["node"], running["steps"]) == ("running", "2", 4)
        seen.append(running["percent"])
    assert seen == [25.0, 50.0, 75.0]

    meshes.set(prompt_id, "done")
    done = await eventually(lambda: _in_state(alice, job_id, "done"))
    assert done["percent"] == 100.0 and done["error"] is None
    (file,) = done["files"]
    assert file["filename"] == "mesh_00001_.glb" and file["content_type"] == "model/gltf-binary"
    async with alice.get(file["url"]) as response:
        assert response.status == 200
        glb = await response.read()
    mesh = trimesh.load(io.BytesIO(glb), file_type="glb", force="mesh", process=False)
    assert mesh.visual.kind == "vertex"
    assert mesh.visual.vertex_colors[:, :3].tolist() == [[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0]]
    (length,) = struct.unpack_from("<I", glb, 12)
    asset = json.loads(glb[20 : 20 + length])["asset"]
    assert asset["copyright"] == "MIT (TripoSR)"
    assert asset["extras"] == {"licence": "MIT (TripoSR)", "model": MESHES}
    await eventually(lambda: hooks.records)
    assert [(r.model, r.completion_tokens, r.status) for r in hooks.records] == [(MESHES, 1, 200)]


async def _ahead(session: aiohttp.ClientSession, job_id: str, ahead: int) -> dict[str, Any] | None:
    state = await _job_state(session, job_id)
    return state if state["ahead"] == ahead else None


async def _at_step(session: aiohttp.ClientSession, job_id: str, step: int) -> dict[str, Any] | None:
    state = await _job_state(session, job_id)
    return state if state["step"] == step else None


async def _in_state(session: aiohttp.ClientSession, job_id: str, wanted: str) -> dict[str, Any] | None:
    state = await _job_state(session, job_id)
    return state if state["state"] == wanted else None


async def test_a_failed_workflow_fails_the_job_saying_why(
    alice: aiohttp.ClientSession, gates: tuple[FakeGate, FakeGate]
) -> None:
    _, meshes = gates
    job_id, prompt_id = await _submit(alice, meshes, {"image": "fox.png"})
    meshes.set(prompt_id, "failed", error="CUDA out of memory in node 2")
    failed = await eventually(lambda: _in_state(alice, job_id, "failed"))
    assert "CUDA out of memory in node 2" in failed["error"]
    assert failed["files"] == []


async def test_cancelling_a_queued_job_deletes_it_from_the_queue_and_a_running_one_interrupts_it(
    alice: aiohttp.ClientSession, gates: tuple[FakeGate, FakeGate]
) -> None:
    _, meshes = gates
    queued_id, queued_prompt = await _submit(alice, meshes, {"image": "a.png"})
    async with alice.delete(f"/v1/jobs/{queued_id}") as response:
        assert response.status == 200
        assert (await response.json())["state"] == "cancelled"
    assert meshes.deleted == [queued_prompt] and meshes.interrupted == []

    running_id, running_prompt = await _submit(alice, meshes, {"image": "b.png"})
    meshes.set(running_prompt, "running", node="2", step=1, steps=4, percent=25.0)
    await eventually(lambda: _in_state(alice, running_id, "running"))
    async with alice.delete(f"/v1/jobs/{running_id}") as response:
        assert (await response.json())["state"] == "cancelled"
    assert meshes.interrupted == [running_prompt]


async def test_another_key_can_neither_read_nor_cancel_a_job(
    alice: aiohttp.ClientSession, bob: aiohttp.ClientSession, gates: tuple[FakeGate, FakeGate]
) -> None:
    _, meshes = gates
    job_id, prompt_id = await _submit(alice, meshes, {"image": "fox.png"})
    for call in (bob.get, bob.delete):
        async with call(f"/v1/jobs/{job_id}") as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "job_not_found"
    assert meshes.deleted == []
    assert (await _job_state(alice, job_id))["state"] == "queued"
    meshes.set(prompt_id, "done")
    await eventually(lambda: _in_state(alice, job_id, "done"))
    async with bob.get(f"/v1/jobs/{job_id}") as response:
        assert response.status == 404


async def test_jobs_refuse_unknown_inputs_and_models_serving_no_workflow(
    alice: aiohttp.ClientSession,
) -> None:
    async with alice.post("/v1/jobs", json={"model": MESHES, "inputs": {"colour": "red"}}) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert "no input 'colour'" in error["message"] and "image, resolution" in error["message"]
    assert error["param"] == "inputs.colour"
    async with alice.post("/v1/jobs", json={"model": CHAT, "inputs": {}}) as response:
        assert response.status == 400
        assert "serves chat" in (await response.json())["error"]["message"]
    async with alice.post("/v1/jobs", json={"model": MESHES, "inputs": ["image"]}) as response:
        assert response.status == 400
    async with alice.get("/v1/jobs/job-never-made") as response:
        assert response.status == 404


async def test_a_picture_model_serves_jobs_too(
    alice: aiohttp.ClientSession, gates: tuple[FakeGate, FakeGate]
) -> None:
    async with alice.post("/v1/jobs", json={"model": PICTURES, "inputs": {"prompt": "a fox"}}) as response:
        assert response.status == 202
        job_id = (await response.json())["id"]
    done = await eventually(lambda: _in_state(alice, job_id, "done"))
    assert [f["content_type"] for f in done["files"]] == ["image/png"]


async def test_a_client_gone_before_its_pictures_cancels_them_on_the_gate(
    alice: aiohttp.ClientSession, gates: tuple[FakeGate, FakeGate], hooks: RecordingOutbound
) -> None:
    pictures, _ = gates
    pictures.finish_at_once = False
    body = {"model": PICTURES, "prompt": "a fox", "n": 2}
    asking = asyncio.create_task(alice.post("/v1/images/generations", json=body))
    await eventually(lambda: len(pictures.prompts) == 2)
    asking.cancel()
    await eventually(lambda: sorted(pictures.deleted) == sorted(pictures.prompts))
    await eventually(lambda: hooks.records)
    assert [(r.completion_tokens, r.status) for r in hooks.records] == [(0, 499)]


async def test_members_of_an_environment_run_on_its_entrys_replica_with_their_own_checkpoint(
    gw: Gateway, sdk: AsyncOpenAI, gates: tuple[FakeGate, FakeGate], hooks: RecordingOutbound
) -> None:
    pictures, _ = gates
    section = {
        "workflow": "flux-schnell",
        "environment": "pics",
        "inputs": {"prompt": {"node": "6", "input": "text"}},
    }
    members = [
        parse_model(comfyui_model(name, "a" * 64, filename=f"{name}.safetensors", comfyui=section))
        for name in ("flux-a", "flux-b")
    ]
    gw.catalog.replace(catalog_entries(members))
    used = hooks.used
    gw.feed.replica_ready(replace(pictures.endpoint, model="comfyui-env-pics"))
    for member in ("flux-b", "flux-a"):
        answer = await sdk.images.generate(model=member, prompt="a fox", response_format="b64_json")
        assert answer.data is not None and len(answer.data) == 1
    checkpoints = [
        node["inputs"]["ckpt_name"]
        for graph in pictures.prompts.values()
        for node in graph.values()
        if node["class_type"] == "CheckpointLoaderSimple"
    ]
    assert checkpoints == ["flux-b.safetensors", "flux-a.safetensors"]
    await eventually(lambda: len(used) == 2)
    assert used == ["comfyui-env-pics"] * 2, "a member's use keeps its environment's entry in use"


async def test_without_a_ready_replica_pictures_ask_for_one_then_answer_503_and_jobs_fail_saying_so(
    gw: Gateway, sdk: AsyncOpenAI, alice: aiohttp.ClientSession, hooks: RecordingOutbound
) -> None:
    demanded = hooks.wanted
    gw.feed.replica_gone("p1")
    gw.feed.replica_gone("m1")
    with pytest.raises(openai.InternalServerError) as waited:
        await sdk.images.generate(model=PICTURES, prompt="a fox")
    assert waited.value.status_code == 503 and waited.value.response.headers["retry-after"] == "5"
    assert "No replica of model 'pictures' is ready" in waited.value.message
    async with alice.post("/v1/jobs", json={"model": MESHES, "inputs": {}}) as response:
        job_id = (await response.json())["id"]
    failed = await eventually(lambda: _in_state(alice, job_id, "failed"))
    assert "No replica of model 'meshes' is ready" in failed["error"]
    assert demanded == [PICTURES, MESHES]


@pytest.mark.parametrize("gw", [30.0], indirect=True)
async def test_a_job_waits_while_its_replicas_load_cannot_be_read_and_runs_once_it_can(
    gw: Gateway, alice: aiohttp.ClientSession, gates: tuple[FakeGate, FakeGate], hooks: RecordingOutbound
) -> None:
    _, meshes = gates
    gw.replicas.set_engine_load("m1", None)
    async with alice.post("/v1/jobs", json={"model": MESHES, "inputs": {}}) as response:
        job_id = (await response.json())["id"]
    await eventually(lambda: gw.feed.model_load(MESHES).waiting == 1, message="the job waits for the load")
    assert meshes.prompts == {} and (await _job_state(alice, job_id))["state"] == "queued"
    assert hooks.wanted == [], "the replica is there: nothing is started"
    gw.replicas.set_engine_load("m1", 0)
    await eventually(lambda: meshes.prompts)
    meshes.set(next(iter(meshes.prompts)), "done")
    done = await eventually(lambda: _in_state(alice, job_id, "done"))
    assert done["files"][0]["filename"] == "mesh_00001_.glb"
