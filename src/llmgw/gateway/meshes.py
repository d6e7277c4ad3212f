"""Meshes leave the gateway as GLB: an OBJ a workflow saved, turned into binary glTF by trimesh.

The OBJ's vertex colours (``v x y z r g b``) are kept (glTF's ``COLOR_0``),
and the model's licence is written into the asset's metadata twice over:
``asset.copyright`` (glTF's own field for the credit a viewer shows) and
``asset.extras.licence`` (with the model's name in ``asset.extras.model``),
so a mesh always carries where it came from.
"""

from __future__ import annotations

import io
from typing import Any

import trimesh

from llmgw.errors import LlmgwError


class MeshError(LlmgwError):
    """A saved file that is no mesh trimesh can read."""


def obj_to_glb(obj: bytes, licence: str, model: str) -> bytes:
    """The GLB of an OBJ file's mesh, vertex colours kept, ``licence`` in the asset's metadata."""
    try:
        loaded = trimesh.load(io.BytesIO(obj), file_type="obj", process=False, force="mesh")
    except Exception as error:  # trimesh raises many kinds on a bad file
        raise MeshError(
            f"the OBJ that model '{model}' saved could not be read: {error}",
            "check the workflow's mesh-saving node",
        ) from error
    if not isinstance(loaded, trimesh.Trimesh) or len(loaded.vertices) == 0:
        raise MeshError(
            f"the OBJ that model '{model}' saved holds no mesh", "check the workflow's mesh-saving node"
        )

    def stamp(tree: dict[str, Any]) -> None:
        asset = tree.setdefault("asset", {"version": "2.0"})
        asset["generator"] = "llmgw"
        if licence:
            asset["copyright"] = licence
        asset["extras"] = {"licence": licence, "model": model}

    glb: bytes = trimesh.exchange.gltf.export_glb(trimesh.Scene(loaded), tree_postprocessor=stamp)  # type: ignore[no-untyped-call]
    return glb


def glb_name(obj_name: str) -> str:
    """``mesh_00001_.obj`` -> ``mesh_00001_.glb``."""
    stem = obj_name[: -len(".obj")] if obj_name.lower().endswith(".obj") else obj_name
    return stem + ".glb"
