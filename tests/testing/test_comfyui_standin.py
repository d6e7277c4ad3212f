"""The ComfyUI stand-in speaks as ComfyUI does: message shapes from its source, real PNG and OBJ files.

The shapes below are those ComfyUI's ``server.py``, ``execution.py`` and
``main.py`` send (Comfy-Org/ComfyUI at a125cd84, October 2025).
"""

from __future__ import annotations

import asyncio
import io
import struct
import subprocess
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trimesh
from aiohttp import web

from llmgw.testing import comfyui_standin
from llmgw.testing.comfyui_standin_nodes import custom_node_classes
from llmgw.testing.comfyui_standin_run import Settings
from llmgw.testing.eventually import eventually
from llmgw.testing.serving import bound_socket
from llmgw.testing.standin_media import obj_text, png_bytes, png_size
from llmgw.testing.standin_programs import write_standins

COMFYUI_SHAPES: dict[str, set[str]] = {
    "status": {"status"},  # + "sid" in the first message of a socket
    "execution_start": {"prompt_id", "timestamp"},
    "progress_state": {"prompt_id", "nodes"},
    "execution_cached": {"nodes", "prompt_id", "timestamp"},
    "executing": {"node", "display_node", "prompt_id"},  # the last one: {"node": None, "prompt_id"}
    "progress": {"value", "max", "prompt_id", "node"},
    "executed": {"node", "display_node", "output", "prompt_id"},
    "execution_success": {"prompt_id", "timestamp"},
    "execution_error": {"prompt_id", "node_id", "node_type", "executed", "exception_message",
                        "exception_type", "traceback", "current_inputs", "current_outputs", "timestamp"},
    "execution_interrupted": {"prompt_id", "node_id", "node_type", "executed", "timestamp"},
}  # fmt: skip

PICTURE = {
    "3": {"class_type": "EmptyLatentImage", "inputs": {"width": 40, "height": 24, "batch_size": 1}},
    "4": {"class_type": "KSampler", "inputs": {"steps": 3, "latent_image": ["3", 0]}},
    "6": {"class_type": "SaveImage", "inputs": {"filename_prefix": "pics/llmgw", "images": ["4", 0]}},
}
MESH = {
    "1": {"class_type": "LoadImage", "inputs": {"image": "chair.png"}},
    "2": {"class_type": "TripoSRSampler", "inputs": {"reference_image": ["1", 0]}},
    "3": {"class_type": "TripoSRViewer", "inputs": {"mesh": ["2", 0]}},
}


@pytest.fixture
def comfy_app(tmp_path: Path) -> web.Application:
    directories = {kind: tmp_path / kind for kind in ("output", "temp", "input")}
    for directory in directories.values():
        directory.mkdir()
    return comfyui_standin.build_app(Settings(tmp_path, directories, step_s=0.01))


@pytest.fixture
async def comfy(comfy_app: web.Application) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    runner = web.AppRunner(comfy_app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    async with aiohttp.ClientSession() as client:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", client
    await runner.cleanup()


async def run(
    url: str, client: aiohttp.ClientSession, prompt: dict[str, Any]
) -> tuple[str, list[dict[str, Any]]]:
    """Queue ``prompt`` under a client id and collect its messages until ComfyUI's last ``executing``."""
    messages: list[dict[str, Any]] = []
    async with client.ws_connect(f"{url}/ws?clientId=tester") as ws:
        messages.append(await ws.receive_json())
        async with client.post(f"{url}/prompt", json={"prompt": prompt, "client_id": "tester"}) as answer:
            queued = await answer.json()
        assert set(queued) == {"prompt_id", "number", "node_errors"}
        while True:
            message = await asyncio.wait_for(ws.receive_json(), 10)
            messages.append(message)
            if message["type"] == "executing" and message["data"]["node"] is None:
                return str(queued["prompt_id"]), messages


async def test_a_workflow_sends_comfyuis_messages_in_comfyuis_order(
    comfy: tuple[str, aiohttp.ClientSession],
) -> None:
    url, client = comfy
    prompt_id, messages = await run(url, client, PICTURE)
    assert messages[0] == {
        "type": "status",
        "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": "tester"},
    }
    for message in messages[1:-1]:
        assert set(message) == {"type", "data"}
        assert set(message["data"]) == COMFYUI_SHAPES[message["type"]], message
    assert messages[-1]["data"] == {"node": None, "prompt_id": prompt_id}
    kinds = [m["type"] for m in messages if m["type"] != "status"]
    assert kinds[:2] == ["execution_start", "execution_cached"]
    assert kinds.index("execution_success") < len(kinds) - 1
    steps = [m["data"]["value"] for m in messages if m["type"] == "progress"]
    assert steps == [1, 2, 3] and {m["data"]["max"] for m in messages if m["type"] == "progress"} == {3}
    executed = next(m["data"] for m in messages if m["type"] == "executed")
    image = executed["output"]["images"][0]
    assert image == {"filename": "llmgw_00001_.png", "subfolder": "pics", "type": "output"}
    async with client.get(f"{url}/view", params=image) as answer:
        assert answer.status == 200 and answer.content_type == "image/png"
        assert png_size(await answer.read()) == (40, 24)
    async with client.get(f"{url}/history/{prompt_id}") as answer:
        record = (await answer.json())[prompt_id]
    assert set(record) == {"prompt", "outputs", "status", "meta"}
    assert record["prompt"][1] == prompt_id and record["prompt"][3] == {"client_id": "tester"}
    assert record["status"]["status_str"] == "success" and record["status"]["completed"] is True
    assert record["outputs"]["6"]["images"] == [image]


async def test_a_mesh_workflow_saves_an_obj_with_vertex_colours(
    comfy: tuple[str, aiohttp.ClientSession],
) -> None:
    url, client = comfy
    _, messages = await run(url, client, MESH)
    assert len([m for m in messages if m["type"] == "progress"]) == 8  # a sampler without steps: eight
    mesh = next(m["data"]["output"]["mesh"][0] for m in messages if m["type"] == "executed")
    assert mesh["filename"].startswith("meshsave_") and mesh["filename"].endswith(".obj")
    async with client.get(f"{url}/view", params=mesh) as answer:
        loaded = trimesh.load(io.BytesIO(await answer.read()), file_type="obj", process=False)
    assert len(loaded.vertices) == 6 and len(loaded.faces) == 8
    colours = loaded.visual.vertex_colors
    assert len({tuple(c) for c in colours}) > 1  # each vertex its own colour, read back


async def test_a_failing_node_sends_comfyuis_execution_error(
    comfy: tuple[str, aiohttp.ClientSession],
) -> None:
    url, client = comfy
    failing = {
        **PICTURE,
        "5": {"class_type": "StandinFail", "inputs": {"message": "CUDA out of memory", "samples": ["4", 0]}},
        "6": {"class_type": "SaveImage", "inputs": {"filename_prefix": "pics/llmgw", "images": ["5", 0]}},
    }
    _, messages = await run(url, client, failing)
    error = next(m["data"] for m in messages if m["type"] == "execution_error")
    assert set(error) == COMFYUI_SHAPES["execution_error"]
    assert error["exception_message"] == "CUDA out of memory" and error["node_type"] == "StandinFail"
    assert "execution_success" not in [m["type"] for m in messages]


async def test_a_workflow_without_outputs_or_prompt_is_refused_as_comfyui_does(
    comfy: tuple[str, aiohttp.ClientSession],
) -> None:
    url, client = comfy
    async with client.post(f"{url}/prompt", json={"prompt": {"1": {"class_type": "KSampler"}}}) as answer:
        assert answer.status == 400
        assert (await answer.json())["error"]["type"] == "prompt_no_outputs"
    async with client.post(f"{url}/prompt", json={"client_id": "x"}) as answer:
        assert answer.status == 400 and (await answer.json())["error"]["type"] == "no_prompt"


async def test_queue_and_interrupt_answer_as_comfyui_does(
    comfy: tuple[str, aiohttp.ClientSession], comfy_app: web.Application
) -> None:
    url, client = comfy
    slow = {**PICTURE, "4": {"class_type": "KSampler", "inputs": {"steps": 1000, "latent_image": ["3", 0]}}}
    ids = []
    for _ in range(2):
        async with client.post(f"{url}/prompt", json={"prompt": slow}) as answer:
            ids.append((await answer.json())["prompt_id"])
    async with client.get(f"{url}/queue") as answer:
        queue = await answer.json()
    assert [item[1] for item in queue["queue_pending"]] == ids[1:]
    assert [item[1] for item in queue["queue_running"]] == ids[:1]
    async with client.post(f"{url}/queue", json={"delete": [ids[1]]}) as answer:
        assert answer.status == 200
    async with client.post(f"{url}/interrupt", json={"prompt_id": "not-running"}) as answer:
        assert answer.status == 200
    assert not comfy_app[comfyui_standin.RUNNER].interrupted, (
        "an interrupt naming another workflow leaves the running one be"
    )
    async with client.post(f"{url}/interrupt") as answer:
        assert answer.status == 200
    for _ in range(500):
        async with client.get(f"{url}/history/{ids[0]}") as answer:
            record = (await answer.json()).get(ids[0])
        if record:
            break
        await asyncio.sleep(0.01)
    assert record["status"]["status_str"] == "error"
    assert record["status"]["messages"][-1][0] == "execution_interrupted"
    assert set(record["status"]["messages"][-1][1]) == COMFYUI_SHAPES["execution_interrupted"]
    async with client.get(f"{url}/history/{ids[1]}") as answer:
        assert await answer.json() == {}


def test_pictures_are_real_pngs() -> None:
    data = png_bytes(7, 5, "a cat")
    assert png_size(data) == (7, 5)
    length = struct.unpack(">I", data[33:37])[0]
    assert data[37:41] == b"IDAT"
    raw = zlib.decompress(data[41 : 41 + length])
    assert len(raw) == 5 * (1 + 3 * 7)
    assert png_bytes(7, 5, "a dog") != data


def test_meshes_carry_a_colour_per_vertex() -> None:
    vertices = [line.split() for line in obj_text("x").splitlines() if line.startswith("v ")]
    assert len(vertices) == 6 and all(len(v) == 7 for v in vertices)
    assert all(0.0 <= float(c) <= 1.0 for v in vertices for c in v[4:])


def test_the_standin_refuses_a_flag_comfyui_has_not(tmp_path: Path) -> None:
    programs = write_standins(tmp_path / "bin")
    done = subprocess.run(
        [str(programs.python), str(programs.comfyui_main), "--bogus"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "unrecognized arguments: --bogus" in done.stderr


async def post_prompt(url: str, client: aiohttp.ClientSession, prompt: Any) -> tuple[int, Any]:
    async with client.post(f"{url}/prompt", json={"prompt": prompt}) as answer:
        return answer.status, await answer.json()


async def test_a_node_of_a_class_nobody_registers_is_refused_as_comfyui_0_3_64_refuses_it(
    comfy: tuple[str, aiohttp.ClientSession],
) -> None:
    url, client = comfy
    missing = {**PICTURE, "5": {"class_type": "FaceDetailer", "inputs": {"image": ["4", 0]}}}
    status, body = await post_prompt(url, client, missing)
    assert status == 400
    assert body == {
        "error": {
            "type": "invalid_prompt",
            "message": "Cannot execute because node FaceDetailer does not exist.",
            "details": "Node ID '#5'",
            "extra_info": {},
        },
        "node_errors": {},
    }
    status, body = await post_prompt(url, client, {**PICTURE, "7": {"inputs": {}}})
    assert status == 400 and body["error"]["type"] == "invalid_prompt"
    assert body["error"]["message"] == "Cannot execute because a node is missing the class_type property."
    async with client.get(f"{url}/queue") as answer:
        assert await answer.json() == {"queue_running": [], "queue_pending": []}


async def test_a_node_of_a_class_nobody_registers_is_refused_as_comfyui_refuses_it_since_pr_12194(
    tmp_path: Path,
) -> None:
    directories = {kind: tmp_path / kind for kind in ("output", "temp", "input")}
    app = comfyui_standin.build_app(Settings(tmp_path, directories, missing_node_type=True))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    missing = {**PICTURE, "5": {"class_type": "FaceDetailer", "inputs": {"image": ["4", 0]}}}
    try:
        async with aiohttp.ClientSession() as client:
            status, body = await post_prompt(url, client, missing)
            assert status == 400
            assert body == {
                "error": {
                    "type": "missing_node_type",
                    "message": "Node 'FaceDetailer' not found. The custom node may not be installed.",
                    "details": "Node ID '#5'",
                    "extra_info": {
                        "node_id": "5",
                        "class_type": "FaceDetailer",
                        "node_title": "FaceDetailer",
                    },
                },
                "node_errors": {},
            }
            titled = {**missing, "5": {**missing["5"], "_meta": {"title": "Fix faces"}}}
            status, body = await post_prompt(url, client, titled)
            assert status == 400 and body["error"]["message"].startswith("Node 'Fix faces' not found.")
            status, body = await post_prompt(url, client, {**PICTURE, "7": {"inputs": {}}})
            assert status == 400 and body["error"]["type"] == "missing_node_type"
            assert body["error"]["extra_info"] == {"node_id": "7", "class_type": None, "node_title": None}
    finally:
        await runner.cleanup()


def test_custom_nodes_register_their_classes_as_comfyui_loads_them(tmp_path: Path) -> None:
    folder = tmp_path / "custom_nodes"
    (folder / "ComfyUI-Thing").mkdir(parents=True)
    (folder / "ComfyUI-Thing/__init__.py").write_text(
        "class Thing: pass\nNODE_CLASS_MAPPINGS = {'ThingNode': Thing, 'KSampler': Thing}\n"
    )
    (folder / "single_file.py").write_text("NODE_CLASS_MAPPINGS = {'SingleNode': object}\n")
    (folder / "Old.disabled").mkdir()
    (folder / "Old.disabled/__init__.py").write_text("NODE_CLASS_MAPPINGS = {'OldNode': object}\n")
    (folder / "Broken").mkdir()
    (folder / "Broken/__init__.py").write_text("import not_a_module_anywhere\n")
    (folder / "NoMappings").mkdir()
    (folder / "NoMappings/__init__.py").write_text("VERSION = 1\n")
    (folder / "notes.txt").write_text("NODE_CLASS_MAPPINGS = {'TextNode': 1}\n")
    assert custom_node_classes(folder, ["KSampler"]) == ["ThingNode", "SingleNode"]
    assert custom_node_classes(tmp_path / "nothing-here") == []


async def test_the_standin_program_knows_the_custom_nodes_in_its_base_directory(tmp_path: Path) -> None:
    programs = write_standins(tmp_path / "bin")
    base = tmp_path / "base"
    (base / "custom_nodes/ComfyUI-Faces").mkdir(parents=True)
    (base / "custom_nodes/ComfyUI-Faces/__init__.py").write_text(
        "NODE_CLASS_MAPPINGS = {'FaceDetailer': object}\n"
    )
    with bound_socket() as sock:
        port = sock.getsockname()[1]
    standin = await asyncio.create_subprocess_exec(
        str(programs.python), str(programs.comfyui_main), "--port", str(port), "--base-directory", str(base)
    )
    url = f"http://127.0.0.1:{port}"
    with_faces = {**PICTURE, "5": {"class_type": "FaceDetailer", "inputs": {"image": ["4", 0]}}}
    try:
        async with aiohttp.ClientSession() as client:
            status, body = await eventually(lambda: post_prompt(url, client, with_faces), timeout_s=30)
            assert status == 200, body
            status, body = await post_prompt(url, client, {**with_faces, "5": {"class_type": "Nope"}})
            assert status == 400
            assert body["error"]["message"] == "Cannot execute because node Nope does not exist."
    finally:
        standin.terminate()
        await standin.wait()


async def test_a_comfyui_older_than_0_3_57_interrupts_whatever_runs(tmp_path: Path) -> None:
    directories = {kind: tmp_path / kind for kind in ("output", "temp", "input")}
    for directory in directories.values():
        directory.mkdir()
    app = comfyui_standin.build_app(Settings(tmp_path, directories, step_s=0.01, interrupt_by_id=False))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as client:
            slow = {**PICTURE, "4": {"class_type": "KSampler", "inputs": {"steps": 1000}}}
            status, queued = await post_prompt(url, client, slow)
            assert status == 200
            await eventually(lambda: app[comfyui_standin.RUNNER].running, message="the workflow runs")
            async with client.post(f"{url}/interrupt", json={"prompt_id": "another"}) as answer:
                assert answer.status == 200
            await eventually(lambda: queued["prompt_id"] in app[comfyui_standin.RUNNER].history)
            record = app[comfyui_standin.RUNNER].history[queued["prompt_id"]]
            assert record["status"]["messages"][-1][0] == "execution_interrupted"
    finally:
        await runner.cleanup()


async def test_a_socket_connecting_again_under_the_running_clients_id_is_told_its_node(
    comfy: tuple[str, aiohttp.ClientSession], comfy_app: web.Application
) -> None:
    """server.py's websocket_handler: ``executing`` with the node alone (no prompt id) after ``status``."""
    url, client = comfy
    slow = {**PICTURE, "4": {"class_type": "KSampler", "inputs": {"steps": 1000, "latent_image": ["3", 0]}}}
    async with client.post(f"{url}/prompt", json={"prompt": slow, "client_id": "again"}) as answer:
        prompt_id = (await answer.json())["prompt_id"]
    runner = comfy_app[comfyui_standin.RUNNER]
    await eventually(lambda: runner.last_node == "4", message="the sampler runs")
    async with client.ws_connect(f"{url}/ws?clientId=again") as ws:
        assert (await ws.receive_json())["type"] == "status"
        assert await asyncio.wait_for(ws.receive_json(), 5) == {"type": "executing", "data": {"node": "4"}}
    async with client.ws_connect(f"{url}/ws?clientId=someone-else") as ws:
        assert (await ws.receive_json())["type"] == "status"
        await ws.close()
    async with client.post(f"{url}/interrupt", json={"prompt_id": prompt_id}) as answer:
        assert answer.status == 200
