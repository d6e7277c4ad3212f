"""A ComfyUI model's workflow as the gateway uses it: the graph, its named inputs, what it makes.

The catalog's ``comfyui:`` section (:mod:`llmgw.core.comfyui`) names the
workflow (an API-format graph: node id -> ``{"class_type", "inputs"}``, or a
preset's), the inputs a client may set (name -> node id and input key), what
it outputs (``image`` or ``mesh``), the model's licence and its checkpoint.
A member of an environment is sent with its own workflow and checkpoint.
:func:`workflow_of` reads that section into a :class:`Workflow`;
:meth:`Workflow.filled` puts a request's values into a copy of the graph,
refusing (400) a name the workflow does not take.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmgw.core.catalog import ModelDefinition
from llmgw.core.engines import Task
from llmgw.gateway.api_errors import ApiError

OUTPUTS = ("image", "mesh")
"""What a workflow makes: pictures (``/v1/images/generations`` and jobs) or meshes (jobs only)."""

SIZE = re.compile(r"^([1-9][0-9]{1,4})x([1-9][0-9]{1,4})$")
MIN_SIDE = 64
MAX_SIDE = 4096


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a named input goes in the graph: ``graph[node]["inputs"][key]``."""

    node: str
    key: str


@dataclass(frozen=True, slots=True)
class Workflow:
    """One model's workflow: the graph, the inputs a client may set, what it makes, its licence."""

    graph: Mapping[str, Any]
    inputs: Mapping[str, Slot] = field(default_factory=dict)
    outputs: str = "image"
    licence: str = ""
    checkpoint: str = ""
    """The weights file its checkpoint loaders load (every ``ckpt_name`` input): the section's
    ``checkpoint``, else the model's one weights file; empty: as the workflow says."""

    @property
    def serves(self) -> Task:
        """The routes that reach it: a picture workflow serves the images API and jobs; others, jobs."""
        return Task.IMAGES if self.outputs == "image" else Task.JOBS

    def takes(self, name: str) -> bool:
        return name in self.inputs

    def filled(self, values: Mapping[str, Any], model: str) -> dict[str, Any]:
        """A copy of the graph with ``values`` (input name -> value) put in; 400 for a name it lacks."""
        graph = copy.deepcopy(dict(self.graph))
        if self.checkpoint:
            for node in graph.values():
                if "ckpt_name" in node.get("inputs", {}):
                    node["inputs"]["ckpt_name"] = self.checkpoint
        for name, value in values.items():
            slot = self.inputs.get(name)
            if slot is None:
                known = ", ".join(sorted(self.inputs)) or "none"
                raise ApiError(
                    400,
                    f"The model '{model}' takes no input '{name}'; its inputs are: {known}.",
                    "unknown_input",
                    f"inputs.{name}",
                )
            if isinstance(value, dict | list):
                raise ApiError(
                    400,
                    f"Input '{name}' must be a string, number or boolean, not {type(value).__name__}.",
                    "invalid_input",
                    f"inputs.{name}",
                )
            graph[slot.node]["inputs"][slot.key] = value
        return graph


def workflow_of(model: ModelDefinition) -> Workflow | None:
    """The :class:`Workflow` of a catalog model's ``comfyui:`` section (a preset's read from its
    file); None for a model without one."""
    section = model.comfyui
    if section is None:
        return None
    inputs = {name: Slot(where.node, where.input) for name, where in section.inputs.items()}
    source = model.source
    assert source is not None, "a ComfyUI model runs from weights in the mirror"
    checkpoint = section.checkpoint or ("" if source.files else source.filename)
    return Workflow(section.api_workflow(), inputs, section.outputs, section.licence, checkpoint)


def parse_size(size: object) -> tuple[int, int]:
    """``"WIDTHxHEIGHT"`` as two integers, each 64..4096 and a multiple of 8; 400 otherwise."""
    match = SIZE.match(size) if isinstance(size, str) else None
    if match is not None:
        width, height = int(match.group(1)), int(match.group(2))
        if all(MIN_SIDE <= side <= MAX_SIDE and side % 8 == 0 for side in (width, height)):
            return width, height
    raise ApiError(
        400,
        f"Invalid size {size!r}: give it as 'WIDTHxHEIGHT' (e.g. '1024x1024'), each side "
        f"{MIN_SIDE} to {MAX_SIDE} pixels and a multiple of 8.",
        "invalid_size",
        "size",
    )
