"""Catalog definitions of ComfyUI models for tests, on whichever engine runs a ``comfyui:`` section."""

from __future__ import annotations

from typing import Any

from llmgw.core.catalog import COMFYUI_ENGINE
from llmgw.core.engines import DEFAULT_ENGINE, find_engine

NODE_COMMIT = "a0c94ac60a7cc062604f61aeeea6d0d493521de3"


def comfyui_profile(**fields: Any) -> dict[str, Any]:
    """A profile on the ComfyUI engine (the default engine where this build has none)."""
    engine = COMFYUI_ENGINE if find_engine(COMFYUI_ENGINE) is not None else DEFAULT_ENGINE
    return {"engine": engine, **fields}


def comfyui_format() -> str:
    """The weights format of :func:`comfyui_profile`'s engine."""
    caps = find_engine(comfyui_profile()["engine"])
    assert caps is not None
    return caps.weights_format.value


def comfyui_model(
    name: str,
    sha256: str,
    *,
    filename: str = "model.safetensors",
    environment: str = "",
    memory_mb: int = 1024,
    nodes: tuple[dict[str, Any], ...] = (),
    hf_repository: str = "",
    **fields: Any,
) -> dict[str, Any]:
    """A ComfyUI model's definition running the flux-schnell workflow."""
    return {
        "name": name,
        "source": {"sha256": sha256, "filename": filename, "format": comfyui_format(), "size": 1 << 20},
        "profile": comfyui_profile(memory_mb=memory_mb),
        "comfyui": {
            "workflow": "flux-schnell",
            "environment": environment,
            "nodes": list(nodes),
            "hf_repository": hf_repository,
        },
        **fields,
    }
