"""Environments: models sharing one ComfyUI are served by one hidden catalog entry.

Models whose ``comfyui.environment`` names the same environment get no
replicas of their own. :func:`expand_environments` replaces them, for
placement, with one entry ``comfyui-env-<name>`` that carries every member's
weights (the first member's file, every other file beside it, refusing two
different files of one name), Hugging Face repositories and custom nodes. It
runs on the first member's profiles, each asking for the most memory any
member needs, on demand when any member is, stopping after the longest idle
timeout, at the highest priority and replica counts of any member. The gateway
sends a request for a member to the entry's replicas (:func:`served_by`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw.core.catalog import COMFYUI_SECTION, ModelDefinition, Replicas, SourceFile
from llmgw.core.comfyui import ComfyUISection, CustomNode

ENTRY_PREFIX = "comfyui-env-"


def entry_name(environment: str) -> str:
    """The hidden catalog entry serving ``environment``."""
    return f"{ENTRY_PREFIX}{environment}"


def is_entry(model: ModelDefinition) -> bool:
    """True for an environment's entry (the reconciler keeps it in the store, for its replicas' sake)."""
    return model.comfyui is not None and bool(model.comfyui.members)


def environment_of(model: ModelDefinition) -> str:
    """The environment ``model`` belongs to; empty when none."""
    return model.comfyui.environment if model.comfyui is not None else ""


@dataclass(frozen=True)
class Expanded:
    """The catalog as placement sees it: models of their own and environment entries."""

    placed: dict[str, ModelDefinition]
    """What the reconciler places, by name: every model outside an environment, and each entry."""
    members: dict[str, tuple[str, ...]]
    """Each entry's members, by the entry's name."""
    refusals: dict[str, str]
    """Environments whose members cannot share one ComfyUI, with why (their members are not placed)."""


def served_by(models: Iterable[ModelDefinition]) -> dict[str, str]:
    """Each member of an environment → the entry serving it."""
    return {m.name: entry_name(env) for m in models if (env := environment_of(m))}


def expand_environments(models: Mapping[str, ModelDefinition]) -> Expanded:
    """``models`` with each environment's members replaced by its entry."""
    placed: dict[str, ModelDefinition] = {}
    groups: dict[str, list[ModelDefinition]] = {}
    for name in sorted(models):
        model = models[name]
        environment = environment_of(model)
        if environment:
            groups.setdefault(environment, []).append(model)
        else:
            placed[name] = model
    members: dict[str, tuple[str, ...]] = {}
    refusals: dict[str, str] = {}
    for environment, group in groups.items():
        entry = entry_name(environment)
        try:
            placed[entry] = environment_entry(environment, group)
        except ValueError as error:
            refusals[environment] = str(error)
            continue
        members[entry] = tuple(m.name for m in group)
    return Expanded(placed, members, refusals)


def environment_entry(environment: str, group: list[ModelDefinition]) -> ModelDefinition:
    """The entry serving ``group`` (in catalog order: the first member's profiles and workflow);
    ValueError when two of their weights files share a name but not a content."""
    first = group[0]
    assert first.comfyui is not None
    memory = max(m.memory_needed_mb(p) for m in group for p in m.profiles)
    files: dict[str, SourceFile] = {}
    for member in group:
        source = member.source
        assert source is not None, "a ComfyUI model runs from weights in the mirror"
        for file in (
            SourceFile(sha256=source.sha256, filename=source.filename, size=source.size),
            *source.files,
        ):
            held = files.get(file.filename)
            if held is not None and held.sha256 != file.sha256:
                raise ValueError(
                    f"two weights files are called {file.filename} in environment {environment} "
                    f"({member.name}'s differs); rename one of them"
                )
            files.setdefault(file.filename, file)
    assert first.source is not None, "a ComfyUI model runs from weights in the mirror"
    main = first.source.filename
    rest = tuple(f for name, f in files.items() if name != main)
    nodes: dict[str, CustomNode] = {}
    for member in group:
        assert member.comfyui is not None
        for node in member.comfyui.nodes:
            held_node = nodes.setdefault(node.folder, node)
            if held_node != node:
                raise ValueError(
                    f"custom node {node.folder} is named at two commits in environment {environment}; "
                    "give every member the same commit"
                )
    repositories = tuple(
        dict.fromkeys(m.comfyui.hf_repository for m in group if m.comfyui and m.comfyui.hf_repository)
    )
    comfyui = ComfyUISection(
        workflow=first.comfyui.workflow,
        inputs=first.comfyui.inputs,
        outputs=first.comfyui.outputs,
        nodes=tuple(nodes.values()),
        licence=first.comfyui.licence,
        environment=environment,
        hf_repository=first.comfyui.hf_repository,
        checkpoint=first.comfyui.checkpoint,
        members=tuple(m.name for m in group),
        hf_repositories=repositories,
    )
    return first.model_copy(
        update={
            "name": entry_name(environment),
            "source": first.source.model_copy(update={"files": rest}),
            "profiles": tuple(p.model_copy(update={"memory_mb": memory}) for p in first.profiles),
            "on_demand": any(m.on_demand for m in group),
            "idle_timeout_s": max(m.idle_timeout_s for m in group),
            "priority": max(m.priority for m in group),
            "replicas": Replicas(
                min=max(m.replicas.min for m in group), max=max(m.replicas.max for m in group)
            ),
            "adapters": (),
            COMFYUI_SECTION: comfyui,
        }
    )
