"""The ComfyUI stand-in's node registry: the classes it knows, and refusing a workflow as ComfyUI does.

ComfyUI knows the classes of its own ``nodes.py`` and ``comfy_extras/`` and
those of each custom node its ``init_external_custom_nodes`` (``nodes.py``)
loads from ``custom_nodes/`` (every folder with an ``__init__.py`` and every
``.py`` file, ``__pycache__`` and ``*.disabled`` skipped, none at all with
``--disable-all-custom-nodes``): the keys of the module's
``NODE_CLASS_MAPPINGS``, a class of ComfyUI's own never replaced. The stand-in
knows the core classes below, its own (:data:`STANDIN_NODES`) and loads
custom nodes the same way.

:func:`refusal` is ``validate_prompt``'s first pass (``execution.py``): a node
without ``class_type`` or of a class nobody registered ends validation with
empty ``node_errors`` and type ``invalid_prompt`` ("Cannot execute because
node X does not exist.", as 0.3.64: ``tests/engines/data/
comfyui-0.3.64-prompt-refused.json``), or, as ComfyUI does since its PR #12194
(January 2026), ``missing_node_type`` (its message names the node's
``_meta.title``, else its class); no output node is ``prompt_no_outputs``.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("llmgw.comfyui_standin")

CORE_NODES = (
    "CheckpointLoaderSimple",
    "CLIPTextEncode",
    "EmptyLatentImage",
    "KSampler",
    "VAEDecode",
    "SaveImage",
    "PreviewImage",
    "LoadImage",
    "UNETLoader",
    "VAELoader",
    "DualCLIPLoader",
    "EmptySD3LatentImage",
)
"""Classes of ComfyUI's own the stand-in runs (``nodes.py``; ``EmptySD3LatentImage``:
``comfy_extras/nodes_sd3.py``)."""
STANDIN_NODES = ("StandinFail", "TripoSRModelLoader", "TripoSRSampler", "TripoSRViewer")
"""The stand-in's own: ``StandinFail`` fails when it runs; TripoSR's three (its custom node
ComfyUI-Flowty-TripoSR) make a mesh, so mesh workflows run without cloning it."""
OUTPUT_NODES = ("SaveImage", "PreviewImage")


def is_output(kind: str) -> bool:
    """An output node (``OUTPUT_NODE = True``): the pictures' and the meshes' savers."""
    return kind in OUTPUT_NODES or is_mesh_output(kind)


def is_mesh_output(kind: str) -> bool:
    return kind == "TripoSRViewer" or kind.endswith("Viewer") or kind.endswith("SaveMesh")


def custom_node_classes(folder: Path, known: Iterable[str] = ()) -> list[str]:
    """The classes the custom nodes in ``folder`` register, loaded as ComfyUI loads them; one that
    fails to import is logged and skipped, as ComfyUI does."""
    ignore = set(known)
    found: list[str] = []
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return found
    for path in entries:
        if path.name == "__pycache__" or path.name.endswith(".disabled"):
            continue
        if path.is_file() and path.suffix != ".py":
            continue
        init = path if path.is_file() else path / "__init__.py"
        name = str(path.with_suffix("") if path.is_file() else path).replace(".", "_x_")
        try:
            spec = importlib.util.spec_from_file_location(name, init)
            if spec is None or spec.loader is None:
                raise ImportError(f"no module at {init}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except Exception as error:  # ComfyUI goes on without it
            log.warning("Cannot import %s module for custom nodes: %s", path, error)
            continue
        mappings = getattr(module, "NODE_CLASS_MAPPINGS", None)
        if not isinstance(mappings, dict):
            log.warning("Skip %s module for custom nodes due to the lack of NODE_CLASS_MAPPINGS", path)
            continue
        found += [str(kind) for kind in mappings if kind not in ignore and kind not in found]
    return found


def _error(kind: str, message: str, details: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "message": message, "details": details, "extra_info": extra}


def refusal(prompt: Any, known: set[str], missing_node_type: bool = False) -> dict[str, Any] | None:
    """The ``error`` ComfyUI's ``validate_prompt`` ends with before it looks at inputs; None: valid.
    ``missing_node_type``: an unknown class as since ComfyUI's PR #12194, else as 0.3.64."""
    if not isinstance(prompt, dict):
        return _error("invalid_prompt", "The prompt is not a mapping of node ids to nodes.", "", {})
    for node_id, node in prompt.items():
        node = node if isinstance(node, dict) else {}
        meta = node.get("_meta")
        title = meta.get("title") if isinstance(meta, dict) else None
        if not missing_node_type:
            if "class_type" not in node:
                why = "Cannot execute because a node is missing the class_type property."
                return _error("invalid_prompt", why, f"Node ID '#{node_id}'", {})
            if node["class_type"] not in known:
                why = f"Cannot execute because node {node['class_type']} does not exist."
                return _error("invalid_prompt", why, f"Node ID '#{node_id}'", {})
            continue
        if "class_type" not in node:
            return _error(
                "missing_node_type",
                f"Node '{title or f'ID #{node_id}'}' has no class_type. "
                "The workflow may be corrupted or a custom node is missing.",
                f"Node ID '#{node_id}'",
                {"node_id": node_id, "class_type": None, "node_title": title},
            )
        kind = node["class_type"]
        if kind not in known:
            return _error(
                "missing_node_type",
                f"Node '{title or kind}' not found. The custom node may not be installed.",
                f"Node ID '#{node_id}'",
                {"node_id": node_id, "class_type": kind, "node_title": title or kind},
            )
    if not any(is_output(node["class_type"]) for node in prompt.values()):
        return _error("prompt_no_outputs", "Prompt has no outputs", "", {})
    return None
