"""What the gateway knows of the catalog: which model names exist, and how to list them.

The control plane keeps this view current from the store; the gateway answers
``GET /v1/models`` from it and refuses requests for names not in it. Each
entry carries its owner: a key sees an entry only when
:func:`~llmgw.core.tenancy.visible` says so (:meth:`GatewayCatalog.visible_to`,
one dictionary and one set lookup); to any other key it does not exist. The
listing is encoded once per change and per place that asks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from llmgw.core.catalog import ModelDefinition
from llmgw.core.engines import Task
from llmgw.core.environments import served_by
from llmgw.core.requestbounds import DEFAULT_BOUNDS, RequestBounds
from llmgw.core.tenancy import CLUSTER, Owner, Place, visible
from llmgw.gateway.workflows import Workflow, workflow_of

LISTINGS_KEPT = 1024
"""Encoded ``/v1/models`` answers kept (one per place that asked) before the cache starts afresh."""


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model a client may ask for."""

    name: str
    on_demand: bool = False
    """True when the model has no replica until a request asks for it."""
    created: int = 0
    """Unix time the model entered the catalog (``created`` in ``/v1/models``)."""
    owner: str = "llmgw"
    """``owned_by`` in ``/v1/models``: ``llmgw`` for public models, else the owner's text."""
    parent: str = ""
    """A LoRA adapter's base model (``parent`` in ``/v1/models``, as vLLM lists it); empty for a model."""
    owned: Owner = CLUSTER
    """Who owns it: only keys that see this owner see the entry."""
    serves: Task = Task.CHAT
    """What its replicas serve: the routes that reach it."""
    served_by: str = ""
    """A member of a ComfyUI environment: the hidden entry whose replicas serve it
    (``comfyui-env-<name>``, :mod:`llmgw.core.environments`); empty: its own replicas."""
    workflow: Workflow | None = field(default=None, compare=False)
    """A ComfyUI model's workflow (its ``comfyui:`` section); None for every other model."""
    bounds: RequestBounds = DEFAULT_BOUNDS
    """What one request may ask (the profile's ``request_limits`` and ``ctx_size``), checked by the
    gateway before forwarding (:func:`~llmgw.core.requestbounds.check_request`)."""
    request_timeout_s: float | None = None
    """Longest a request may take on its engine (the profiles' ``request_timeout_s``, the longest
    where they differ; an adapter's is its base model's); None: no limit but the silence one."""
    fallbacks: tuple[str, ...] = ()
    """The models a request for this one falls to, in order (:mod:`llmgw.core.fallbacks`)."""
    fallback_ttft_s: float | None = None
    """Longest wait for the first token before a request falls to the next model; None: any."""

    def visible_to(self, place: Place) -> bool:
        return visible(self.owned, place)

    def as_openai(self) -> dict[str, object]:
        listed: dict[str, object] = {
            "id": self.name, "object": "model", "created": self.created, "owned_by": self.owner
        }  # fmt: skip
        if self.parent:
            listed["parent"] = self.parent
        listed["serves"] = self.serves.value
        return listed


def catalog_entries(models: Iterable[ModelDefinition]) -> list[ModelEntry]:
    """What clients may ask for: each model, and each of its LoRA adapters (``parent`` the model).
    An environment's hidden entry is not among them; its members name it in ``served_by``."""
    entries = []
    models = list(models)
    serving = served_by(models)
    for model in models:
        on_demand = model.on_demand or model.replicas.min == 0
        owned = model.owned_by()
        workflow = workflow_of(model)
        serves = workflow.serves if workflow is not None else model.profile.serves
        bounds = model.profile.request_limits.bounds(model.profile.ctx_size)
        limit = request_timeout(model)
        entries.append(
            ModelEntry(
                model.name,
                on_demand,
                owner=_owned_by(owned),
                owned=owned,
                serves=serves,
                served_by=serving.get(model.name, ""),
                workflow=workflow,
                bounds=bounds,
                request_timeout_s=limit,
                fallbacks=model.fallbacks,
                fallback_ttft_s=model.fallback_ttft_ms / 1000 if model.fallback_ttft_ms else None,
            )
        )
        for adapter in model.adapters:
            owned = model.adapter_owner(adapter)
            entries.append(
                ModelEntry(
                    adapter.name,
                    on_demand,
                    owner=_owned_by(owned),
                    parent=model.name,
                    owned=owned,
                    serves=serves,
                    bounds=bounds,
                    request_timeout_s=limit,
                )
            )
    return entries


def request_timeout(model: ModelDefinition) -> float | None:
    """The model's time limit on its engine: the longest of its profiles', None when one has none
    (a replica of that profile may take as long as it needs); a provider model's total timeout."""
    if model.provider is not None:
        return model.provider.timeouts.total_s
    limits = [profile.request_timeout_s for profile in model.profiles]
    if any(limit is None for limit in limits):
        return None
    return max(limit for limit in limits if limit is not None)


def _owned_by(owner: Owner) -> str:
    return "llmgw" if owner.public else str(owner)


class GatewayCatalog:
    """The catalog's models by name, with the ``/v1/models`` answer cached between changes."""

    def __init__(self, entries: Iterable[ModelEntry] = ()) -> None:
        self._entries: dict[str, ModelEntry] = {}
        self._listings: dict[frozenset[Owner] | None, bytes] = {}
        self.replace(entries)

    def replace(self, entries: Iterable[ModelEntry]) -> None:
        """Make ``entries`` the whole catalog."""
        self._entries = {entry.name: entry for entry in entries}
        self._listings = {}

    def put(self, entry: ModelEntry) -> None:
        """Add a model, or replace the one with the same name."""
        self._entries[entry.name] = entry
        self._listings = {}

    def remove(self, name: str) -> bool:
        """Forget a model; False when there was none of that name."""
        self._listings = {}
        return self._entries.pop(name, None) is not None

    def get(self, name: str) -> ModelEntry | None:
        """The entry called ``name``, whoever owns it (the control plane's view, not a key's)."""
        return self._entries.get(name)

    def visible_to(self, name: str, place: Place) -> ModelEntry | None:
        """The entry called ``name`` when a key at ``place`` sees it; None as for a name never defined."""
        entry = self._entries.get(name)
        if entry is None or not visible(entry.owned, place):
            return None
        return entry

    def entries(self) -> list[ModelEntry]:
        """The models, sorted by name."""
        return sorted(self._entries.values(), key=lambda entry: entry.name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def listing(self, place: Place | None = None) -> bytes:
        """The body of ``GET /v1/models`` for a key at ``place`` (None: every entry): OpenAI's list
        shape, encoded once per change and per place."""
        reach = None if place is None else place.reach
        listing = self._listings.get(reach)
        if listing is None:
            shown = self.entries() if place is None else [e for e in self.entries() if e.visible_to(place)]
            data = [entry.as_openai() for entry in shown]
            listing = json.dumps({"object": "list", "data": data}, separators=(",", ":")).encode()
            if len(self._listings) >= LISTINGS_KEPT:
                self._listings = {}
            self._listings[reach] = listing
        return listing
