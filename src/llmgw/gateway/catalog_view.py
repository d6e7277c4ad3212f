"""What the gateway knows of the catalog: which model names exist, and how to list them.

The control plane keeps this view current from the store; the gateway answers
``GET /v1/models`` from it and refuses requests for names not in it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from llmgw.core.catalog import ModelDefinition


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model a client may ask for."""

    name: str
    on_demand: bool = False
    """True when the model has no replica until a request asks for it."""
    created: int = 0
    """Unix time the model entered the catalog (``created`` in ``/v1/models``)."""
    owner: str = "llmgw"
    """Who owns the model (``owned_by`` in ``/v1/models``)."""
    parent: str = ""
    """A LoRA adapter's base model (``parent`` in ``/v1/models``, as vLLM lists it); empty for a model."""

    def as_openai(self) -> dict[str, object]:
        listed: dict[str, object] = {
            "id": self.name, "object": "model", "created": self.created, "owned_by": self.owner
        }  # fmt: skip
        if self.parent:
            listed["parent"] = self.parent
        return listed


def catalog_entries(models: Iterable[ModelDefinition]) -> list[ModelEntry]:
    """What clients may ask for: each model, and each of its LoRA adapters (``parent`` the model)."""
    entries = []
    for model in models:
        on_demand = model.on_demand or model.replicas.min == 0
        owner = model.owner or "llmgw"
        entries.append(ModelEntry(name=model.name, on_demand=on_demand, owner=owner))
        for adapter in model.adapters:
            entries.append(ModelEntry(name=adapter.name, on_demand=on_demand, owner=owner, parent=model.name))
    return entries


class GatewayCatalog:
    """The catalog's models by name, with the ``/v1/models`` answer cached between changes."""

    def __init__(self, entries: Iterable[ModelEntry] = ()) -> None:
        self._entries: dict[str, ModelEntry] = {}
        self._listing: bytes | None = None
        self.replace(entries)

    def replace(self, entries: Iterable[ModelEntry]) -> None:
        """Make ``entries`` the whole catalog."""
        self._entries = {entry.name: entry for entry in entries}
        self._listing = None

    def put(self, entry: ModelEntry) -> None:
        """Add a model, or replace the one with the same name."""
        self._entries[entry.name] = entry
        self._listing = None

    def remove(self, name: str) -> bool:
        """Forget a model; False when there was none of that name."""
        self._listing = None
        return self._entries.pop(name, None) is not None

    def get(self, name: str) -> ModelEntry | None:
        return self._entries.get(name)

    def entries(self) -> list[ModelEntry]:
        """The models, sorted by name."""
        return sorted(self._entries.values(), key=lambda entry: entry.name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def listing(self) -> bytes:
        """The body of ``GET /v1/models``: OpenAI's list shape, encoded once per change."""
        if self._listing is None:
            data = [entry.as_openai() for entry in self.entries()]
            self._listing = json.dumps({"object": "list", "data": data}, separators=(",", ":")).encode()
        return self._listing
