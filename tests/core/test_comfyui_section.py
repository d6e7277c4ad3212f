"""The catalog's comfyui: section: custom nodes at full commits, PyPI packages only, workflows."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.core.catalog import parse_model
from llmgw.core.comfyui import ComfyUISection, package_problem, preset_workflow
from llmgw.errors import ValidationFailed
from llmgw.testing.comfyui_models import NODE_COMMIT, comfyui_model

REPO = "https://github.com/flowtyone/ComfyUI-Flowty-TripoSR"


def problems(**section: Any) -> dict[str, str]:
    definition = comfyui_model("m", "a" * 64)
    definition["comfyui"] = {"workflow": "flux-schnell", **section}
    with pytest.raises(ValidationFailed) as caught:
        parse_model(definition)
    return dict(caught.value.problems)


def test_a_custom_node_at_a_full_commit_with_pypi_packages_is_taken() -> None:
    node_fields = {"repository": REPO + "/", "commit": NODE_COMMIT.upper(),
                   "packages": ["trimesh>=4", "omegaconf==2.3.0"]}  # fmt: skip
    definition = comfyui_model("m", "a" * 64, nodes=(node_fields,))
    node = parse_model(definition).comfyui.nodes[0]  # type: ignore[union-attr]
    assert (node.repository, node.commit, node.folder) == (REPO, NODE_COMMIT, "ComfyUI-Flowty-TripoSR")
    assert node.packages == ("trimesh>=4", "omegaconf==2.3.0")


@pytest.mark.parametrize("commit", ["main", "a0c94ac", "v1.0", NODE_COMMIT + "0"])
def test_a_branch_tag_or_short_hash_is_refused_naming_the_field(commit: str) -> None:
    found = problems(nodes=[{"repository": REPO, "commit": commit}])
    assert "40 hexadecimal digits" in found["comfyui.nodes.0.commit"]


@pytest.mark.parametrize(
    "repository", ["http://github.com/a/b", "git@github.com:a/b.git", "file:///tmp/x", "b"]
)
def test_a_repository_not_over_https_is_refused(repository: str) -> None:
    assert (
        "https"
        in problems(nodes=[{"repository": repository, "commit": NODE_COMMIT}])["comfyui.nodes.0.repository"]
    )


@pytest.mark.parametrize(
    "spec",
    [
        "git+https://github.com/a/b",
        "b @ https://x/b.whl",
        "./local",
        "-e .",
        "--index-url https://x",
        "/tmp/b.whl",
        "",
    ],
)
def test_anything_but_a_pypi_requirement_is_refused_as_a_package(spec: str) -> None:
    assert package_problem(spec)
    found = problems(nodes=[{"repository": REPO, "commit": NODE_COMMIT, "packages": ["trimesh", spec]}])
    assert repr(spec) in found["comfyui.nodes.0.packages"]


@pytest.mark.parametrize("spec", ["trimesh", "imageio[ffmpeg]>=2", "numpy<2; python_version<'3.13'"])
def test_pypi_requirements_are_taken(spec: str) -> None:
    assert package_problem(spec) == ""


def test_an_unknown_workflow_name_and_an_editor_save_are_refused() -> None:
    assert "flux-schnell" in problems(workflow="sdxl")["comfyui.workflow"]
    assert "API format" in problems(workflow={"nodes": [1]})["comfyui.workflow"]


def test_an_input_must_name_a_node_of_the_workflow() -> None:
    found = problems(inputs={"prompt": {"node": "99", "input": "text"}})
    assert "no node '99'" in found["comfyui"]
    section = ComfyUISection(workflow="flux-schnell", inputs={"prompt": {"node": "6", "input": "text"}})
    assert section.api_workflow()["6"]["class_type"] == "CLIPTextEncode"


def test_an_environment_name_and_a_hugging_face_repository_are_checked() -> None:
    assert "lower-case" in problems(environment="Shared Env")["comfyui.environment"]
    assert "owner/name" in problems(hf_repository="not a repo")["comfyui.hf_repository"]


def test_two_custom_nodes_in_one_folder_are_refused() -> None:
    node = {"repository": REPO, "commit": NODE_COMMIT}
    assert (
        "same folder"
        in problems(nodes=[node, {**node, "repository": "https://x.org/y/ComfyUI-Flowty-TripoSR"}])["comfyui"]
    )


def test_the_preset_workflows_are_in_api_format_and_the_mesh_one_removes_the_background() -> None:
    triposr = preset_workflow("triposr")
    classes = {node["class_type"] for node in triposr.values()}
    assert {"LoadImage", "InspyrenetRembg", "TripoSRSampler", "TripoSRViewer"} <= classes
    sampler = next(n for n in triposr.values() if n["class_type"] == "TripoSRSampler")
    rembg = next(i for i, n in triposr.items() if n["class_type"] == "InspyrenetRembg")
    assert sampler["inputs"]["reference_mask"] == [rembg, 1]
    flux = preset_workflow("flux-schnell")
    assert any(n["class_type"] == "SaveImage" for n in flux.values())
