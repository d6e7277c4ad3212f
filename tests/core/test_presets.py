"""The preset catalog: every preset's definition is one the catalog takes."""

from __future__ import annotations

import pytest

from llmgw.core.catalog import ModelDefinition
from llmgw.core.presets import PRESETS, preset
from llmgw.errors import NotFound


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_presets_definition_is_a_valid_model(name: str) -> None:
    model = ModelDefinition.model_validate(PRESETS[name].definition("c" * 64, 1000))
    assert (model.name, model.source.sha256, model.source.size) == (name, "c" * 64, 1000)
    assert model.memory_needed_mb() == PRESETS[name].memory_mb


def test_an_unknown_preset_names_the_ones_there_are() -> None:
    with pytest.raises(NotFound) as caught:
        preset("flux-dev")
    assert "smollm2-135m-instruct" in caught.value.hint
