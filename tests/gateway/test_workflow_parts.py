"""The parts behind pictures and jobs: workflows filled, sizes, files and jobs kept, OBJ to GLB."""

from __future__ import annotations

import io
import json
import struct

import pytest
import trimesh

from llmgw.core.catalog import parse_model
from llmgw.core.engines import Task
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.files import FileStore
from llmgw.gateway.jobs import JobBook, JobState, new_job
from llmgw.gateway.meshes import MeshError, glb_name, obj_to_glb
from llmgw.gateway.workflows import Slot, Workflow, parse_size, workflow_of
from llmgw.testing.clock import FakeClock
from llmgw.testing.comfyui_models import comfyui_model

from .fake_gate import COLOURED_OBJ

GRAPH = {"6": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}}}


def test_a_section_gives_the_workflow_its_inputs_outputs_licence_and_checkpoint() -> None:
    section = {
        "workflow": GRAPH,
        "inputs": {"prompt": {"node": "6", "input": "text"}},
        "outputs": "mesh",
        "licence": "MIT",
    }
    model = parse_model(comfyui_model("m", "a" * 64, filename="mine.safetensors", comfyui=section))
    workflow = workflow_of(model)
    assert workflow is not None
    assert dict(workflow.inputs) == {"prompt": Slot("6", "text")}
    assert (workflow.serves, workflow.licence, workflow.checkpoint) == (Task.JOBS, "MIT", "mine.safetensors")
    assert Task.IMAGES.covers(Task.JOBS) and not Task.JOBS.covers(Task.IMAGES)


def test_a_preset_workflow_is_read_and_its_checkpoint_loader_given_the_models_file() -> None:
    model = parse_model(comfyui_model("flux", "a" * 64, filename="flux-dev.safetensors"))
    workflow = workflow_of(model)
    assert workflow is not None and workflow.serves is Task.IMAGES
    filled = workflow.filled({}, "flux")
    loaders = [node for node in filled.values() if node["class_type"] == "CheckpointLoaderSimple"]
    assert [node["inputs"]["ckpt_name"] for node in loaders] == ["flux-dev.safetensors"]


def test_filling_copies_the_graph_and_refuses_names_and_values_it_cannot_take() -> None:
    workflow = Workflow(GRAPH, {"prompt": Slot("6", "text")})
    filled = workflow.filled({"prompt": "a fox"}, "pics")
    assert filled["6"]["inputs"] == {"text": "a fox", "clip": ["4", 1]}
    assert GRAPH["6"]["inputs"]["text"] == "", "the model's own graph is untouched"
    with pytest.raises(ApiError) as unknown:
        workflow.filled({"steps": 3}, "pics")
    assert (
        unknown.value.status == 400
        and "'pics' takes no input 'steps'; its inputs are: prompt" in unknown.value.message
    )
    with pytest.raises(ApiError) as nested:
        workflow.filled({"prompt": ["6", 0]}, "pics")
    assert nested.value.status == 400, "a client may not wire nodes together"


@pytest.mark.parametrize("size", ["1024x1024", "512x768", "64x4096"])
def test_sizes_taken(size: str) -> None:
    width, height = parse_size(size)
    assert f"{width}x{height}" == size


@pytest.mark.parametrize("size", ["big", "1024", "1024x", "1023x1024", "32x32", "8192x8192", 1024, "-64x64"])
def test_sizes_refused_say_the_form(size: object) -> None:
    with pytest.raises(ApiError) as refused:
        parse_size(size)
    assert refused.value.status == 400 and refused.value.param == "size"
    assert "'WIDTHxHEIGHT'" in refused.value.message


async def test_files_are_kept_for_their_key_for_a_while_and_within_their_bytes() -> None:
    clock = FakeClock()
    files = FileStore(ttl_s=60, max_bytes=10, clock=clock)
    first = files.put("k1", "a.png", b"12345")
    assert files.get(first.file_id, "k1") == first
    assert files.get(first.file_id, "k2") is None
    assert first.content_type == "image/png"
    second = files.put("k1", "b.glb", b"123456")
    assert files.get(first.file_id, "k1") is None, "over its bytes, the oldest goes"
    assert files.get(second.file_id, "k1") is not None
    await clock.advance(60)
    assert files.get(second.file_id, "k1") is None and len(files) == 0


async def test_the_job_book_is_bounded_keeps_ended_jobs_a_while_and_hides_others_jobs() -> None:
    clock = FakeClock()
    book = JobBook(max_jobs=2, kept_s=30, clock=clock)
    workflow = Workflow(GRAPH)
    first, second = new_job("k1", "m", {}, workflow), new_job("k1", "m", {}, workflow)
    book.add(first)
    book.add(second)
    assert book.get(first.job_id, "k2") is None
    with pytest.raises(ApiError) as full:
        book.add(new_job("k1", "m", {}, workflow))
    assert full.value.status == 429
    first.state, first.ended_at = JobState.DONE, clock()
    third = new_job("k1", "m", {}, workflow)
    book.add(third)
    assert book.get(first.job_id, "k1") is None, "full, the oldest ended job makes room"
    second.state, second.ended_at = JobState.FAILED, clock()
    await clock.advance(29)
    assert book.get(second.job_id, "k1") is second
    await clock.advance(1)
    assert book.get(second.job_id, "k1") is None and book.get(third.job_id, "k1") is third


def test_an_obj_becomes_a_glb_with_its_colours_and_licence() -> None:
    glb = obj_to_glb(COLOURED_OBJ, "CC-BY-4.0", "triposr")
    mesh = trimesh.load(io.BytesIO(glb), file_type="glb", force="mesh", process=False)
    assert len(mesh.vertices) == 4 and len(mesh.faces) == 4
    assert mesh.visual.vertex_colors[:, :3].tolist() == [[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0]]
    (length,) = struct.unpack_from("<I", glb, 12)
    asset = json.loads(glb[20 : 20 + length])["asset"]
    assert asset["copyright"] == "CC-BY-4.0" and asset["extras"]["licence"] == "CC-BY-4.0"
    assert glb_name("mesh_00001_.obj") == "mesh_00001_.glb"


def test_a_file_that_is_no_mesh_is_refused_saying_so() -> None:
    with pytest.raises(MeshError) as refused:
        obj_to_glb(b"# nothing here\n", "MIT", "triposr")
    assert "model 'triposr'" in str(refused.value)
