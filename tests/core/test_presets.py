"""The preset catalog: every preset's definition is one the catalog takes."""

from __future__ import annotations

import pytest

from llmgw.core.catalog import ModelDefinition
from llmgw.core.comfyui import ComfyUISection
from llmgw.core.engines import find_engine
from llmgw.core.presets import PRESETS, preset
from llmgw.errors import NotFound

RUNNABLE = sorted(n for n, p in PRESETS.items() if find_engine(p.definition("c" * 64)["profile"]["engine"]))
"""The presets whose engine this build has (ComfyUI's row comes with its gate)."""
COMFYUI = ["flux-schnell", "triposr"]


@pytest.mark.parametrize("name", RUNNABLE)
def test_every_presets_definition_is_a_valid_model(name: str) -> None:
    model = ModelDefinition.model_validate(PRESETS[name].definition("c" * 64, 1000))
    assert (model.name, model.source.sha256, model.source.size) == (name, "c" * 64, 1000)
    assert model.memory_needed_mb() == PRESETS[name].memory_mb


def test_an_unknown_preset_names_the_ones_there_are() -> None:
    with pytest.raises(NotFound) as caught:
        preset("flux-dev")
    assert "smollm2-135m-instruct" in caught.value.hint


@pytest.mark.parametrize("name", COMFYUI)
def test_the_comfyui_presets_say_their_workflow_nodes_licence_and_card_memory(name: str) -> None:
    found = preset(name)
    definition = found.definition("c" * 64, 1000)
    section = ComfyUISection.model_validate(definition["comfyui"])
    assert section.licence and section.hf_repository == found.hf_repository
    assert definition["profile"]["memory_mb"] == found.memory_mb
    assert definition["profile"]["engine"] == "comfyui"
    assert f"hf:{found.hf_repository}" in found.needs and f"{found.memory_mb} MiB" in found.needs
    assert section.inputs and all(w.node in section.api_workflow() for w in section.inputs.values())


def test_triposr_removes_the_background_with_a_node_at_a_full_commit() -> None:
    section = ComfyUISection.model_validate(preset("triposr").definition("c" * 64)["comfyui"])
    assert section.outputs == "mesh"
    assert {n.folder for n in section.nodes} == {"ComfyUI-Flowty-TripoSR", "ComfyUI-Inspyrenet-Rembg"}
    assert "transparent-background" in next(n for n in section.nodes if "Rembg" in n.folder).packages
