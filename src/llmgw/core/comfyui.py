"""A catalog model's ``comfyui:`` section: the workflow it runs and what that workflow needs.

``workflow`` is a preset workflow's name (a JSON file shipped in
``llmgw/core/workflows/``) or an inline workflow in ComfyUI's API format (node
id → ``{"class_type", "inputs"}``); ``inputs`` says where each of the job's
inputs goes in it. ``nodes`` are custom nodes, each an https repository at a
full 40-hex commit (a branch or a short hash is refused: either could mean
another tree tomorrow) with the PyPI packages it needs, given as requirement
strings only (no URLs, paths or pip options). ``environment`` names a ComfyUI
shared with other models (:mod:`llmgw.core.environments`).
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

COMMIT_PATTERN = re.compile(r"[0-9a-f]{40}")
REPOSITORY_PATTERN = re.compile(r"https://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._~-]+)+/?")
ENVIRONMENT_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
HF_REPOSITORY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
WORKFLOWS = "workflows"
"""The folder of ``llmgw.core`` holding the workflows presets name."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def package_problem(spec: str) -> str:
    """Why ``spec`` is not a plain PyPI requirement string (``name[extra]>=1,<2; marker``); empty if it is."""
    text = spec.strip()
    if not text or text.startswith("-"):
        return f"{spec!r} is a pip option, not a package: give a PyPI requirement such as 'trimesh>=4'"
    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        return f"{spec!r} is not a PyPI requirement (a URL, a path or git+ are refused): give 'name>=version'"
    if requirement.url:
        return f"{spec!r} names a URL; only PyPI packages are installed: give 'name==version'"
    return ""


class CustomNode(_Strict):
    """One custom node: a git repository over https, at a full commit, with its PyPI packages."""

    repository: str
    """``https://host/owner/name`` (cloned into the replica's ``custom_nodes/``)."""
    commit: str
    """The full 40-hex commit; a branch, a tag or a short hash is refused."""
    packages: tuple[str, ...] = ()
    """PyPI requirement strings, installed beside the replica, constrained to ComfyUI's own versions."""

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str) -> str:
        if not REPOSITORY_PATTERN.fullmatch(value):
            raise ValueError(f"{value!r} is not an https repository URL (https://host/owner/name)")
        return value.rstrip("/")

    @field_validator("commit")
    @classmethod
    def _commit(cls, value: str) -> str:
        if not COMMIT_PATTERN.fullmatch(value.lower()):
            raise ValueError(
                f"{value!r} is not a full commit: give the 40 hexadecimal digits "
                "('git rev-parse BRANCH' prints them), never a branch, tag or short hash"
            )
        return value.lower()

    @field_validator("packages")
    @classmethod
    def _packages(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        problems = [why for spec in value if (why := package_problem(spec))]
        if problems:
            raise ValueError("; ".join(problems))
        return tuple(spec.strip() for spec in value)

    @property
    def folder(self) -> str:
        """Its folder under ``custom_nodes/``: the repository's last part."""
        return self.repository.rsplit("/", 1)[-1].removesuffix(".git")


class WorkflowInput(_Strict):
    """Where one input of a job goes: a node of the workflow and one of its inputs."""

    node: str
    input: str


class ComfyUISection(_Strict):
    """What a ComfyUI model runs (``comfyui:`` in its definition)."""

    workflow: str | dict[str, Any]
    """A preset workflow's name, or a workflow in ComfyUI's API format."""
    inputs: dict[str, WorkflowInput] = Field(default_factory=dict)
    """A job's input name → where it goes in the workflow."""
    outputs: Literal["image", "mesh"] = "image"
    """What the workflow makes: pictures, or a mesh (an OBJ, handed out as a GLB)."""
    nodes: tuple[CustomNode, ...] = ()
    licence: str = ""
    """The model's licence, carried in what it makes (a GLB's metadata)."""
    environment: str = ""
    """A ComfyUI shared with the other models naming it; empty: a ComfyUI of its own."""
    hf_repository: str = ""
    """The Hugging Face repository the weights come from, linked into the HF cache for nodes that read it."""
    checkpoint: str = ""
    """The weights file the workflow loads; empty: the source's file."""
    members: tuple[str, ...] = ()
    """An environment's entry only: the models it serves (set by :mod:`llmgw.core.environments`)."""
    hf_repositories: tuple[str, ...] = ()
    """An environment's entry only: every member's Hugging Face repository."""

    @field_validator("environment")
    @classmethod
    def _environment(cls, value: str) -> str:
        if value and not ENVIRONMENT_PATTERN.fullmatch(value):
            raise ValueError(
                f"{value!r}: an environment's name is lower-case letters, digits and '-' (40 at most)"
            )
        return value

    @field_validator("hf_repository")
    @classmethod
    def _hf_repository(cls, value: str) -> str:
        if value and not HF_REPOSITORY_PATTERN.fullmatch(value):
            raise ValueError(f"{value!r} is not a Hugging Face repository: give 'owner/name'")
        return value

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(value, str):
            if value not in workflow_names():
                known = ", ".join(workflow_names())
                raise ValueError(
                    f"no workflow {value!r} comes with llmgw (known: {known}); or give one inline"
                )
            return value
        why = workflow_problem(value)
        if why:
            raise ValueError(why)
        return value

    @model_validator(mode="after")
    def _inputs_in_workflow(self) -> ComfyUISection:
        nodes = self.api_workflow()
        for name, where in self.inputs.items():
            if where.node not in nodes:
                raise ValueError(f"inputs.{name}: the workflow has no node {where.node!r}")
        folders = [node.folder for node in self.nodes]
        if len(set(folders)) != len(folders):
            raise ValueError("nodes: two custom nodes have the same folder name; keep one")
        return self

    def api_workflow(self) -> dict[str, Any]:
        """The workflow in ComfyUI's API format (a preset's read from its file)."""
        if isinstance(self.workflow, str):
            return dict(preset_workflow(self.workflow))
        return self.workflow


def workflow_problem(workflow: dict[str, Any]) -> str:
    """Why ``workflow`` is not in ComfyUI's API format; empty when it is."""
    if not workflow:
        return "the workflow has no nodes"
    for node_id, node in workflow.items():
        if not isinstance(node, dict) or not isinstance(node.get("class_type"), str):
            return (
                f"workflow node {node_id!r} has no class_type: give the API format "
                "(ComfyUI's 'Export (API)'), not the editor's save"
            )
        if not isinstance(node.get("inputs", {}), dict):
            return f"workflow node {node_id!r}: inputs must be a mapping"
    return ""


@cache
def workflow_names() -> tuple[str, ...]:
    """The workflows that come with llmgw, by name."""
    folder = resources.files("llmgw.core").joinpath(WORKFLOWS)
    return tuple(sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")))


@cache
def preset_workflow(name: str) -> dict[str, Any]:
    """The workflow ``name`` that comes with llmgw, in API format."""
    text = resources.files("llmgw.core").joinpath(WORKFLOWS, f"{name}.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded
