"""A training job's base files are written on its node under their names: a name that is a path, or
holds a control character, is refused by the request's model."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmgw.adminapi.training import BaseFile

SHA = "a" * 64


@pytest.mark.parametrize(
    "filename", ["../model.safetensors", "..", "dir\\model.gguf", "m\x00.gguf", "m\n.gguf"]
)
def test_a_base_file_named_as_a_path_or_with_a_control_character_is_refused(filename: str) -> None:
    with pytest.raises(ValidationError, match="filename"):
        BaseFile(sha256=SHA, filename=filename)


def test_a_plain_base_file_name_is_kept() -> None:
    assert BaseFile(sha256=SHA, filename="model-00001.safetensors").filename == "model-00001.safetensors"
