"""The tiny GGUF a llama.cpp build loads to prove it computes, written here rather than downloaded.

A node checks each llama.cpp build before it accepts it (:mod:`llmgw.engines.buildverdicts`):
the build must load a model, put every layer where it should, and answer a
token. The model has to be on the node before any model is, offline too, so
llmgw writes one: a Llama-architecture model of two layers (embedding 128,
two heads of 64, feed-forward 256, F16 weights, F32 norms) with a byte-level
SentencePiece vocabulary of 259 tokens (``<unk>``, ``<s>``, ``</s>`` and the
256 byte tokens ``<0x00>`` … ``<0xFF>``, so any prompt tokenizes by byte
fallback). Its weights are random from a fixed seed, so every node writes
the same 0.8 MB file; what it says is noise, but every matrix product,
attention and norm of a real model runs on the device, and llama.cpp's
start-up output says where its three layers (two blocks and the output) went.

The layout is GGUF version 3, little-endian, as llama.cpp's ``gguf-py``
writes it: magic, version, tensor and key counts; the keys (each a string,
a type and a value; arrays as element type, count, elements); the tensor
infos (name, dimensions fastest first, ggml type, offset in the data);
then the data, each tensor at a multiple of 32 bytes.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

FILENAME = "llmgw-check-llama-2x128.gguf"
ALIGNMENT = 32
EMBEDDING, HEADS, FEED_FORWARD, BLOCKS, CONTEXT = 128, 2, 256, 2, 512
LAYERS = BLOCKS + 1
"""What llama.cpp counts as the model's layers: its blocks and the output layer."""
SEED = 20240131

_UINT32, _INT32, _FLOAT32, _STRING, _ARRAY = 4, 5, 6, 8, 9
_GGML_F32, _GGML_F16 = 0, 1
_UNKNOWN, _CONTROL, _BYTE = 2, 3, 6

Value = str | int | float | list[str] | list[float] | list[int]


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _value(kind: int, value: Value, element: int = 0) -> bytes:
    if kind == _STRING:
        assert isinstance(value, str)
        return _string(value)
    if kind == _ARRAY:
        assert isinstance(value, list)
        items = b"".join(_value(element, item) for item in value)
        return struct.pack("<IQ", element, len(value)) + items
    return struct.pack({_UINT32: "<I", _INT32: "<i", _FLOAT32: "<f"}[kind], value)


def _vocabulary() -> tuple[list[str], list[int]]:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256))]
    types = [_UNKNOWN, _CONTROL, _CONTROL, *([_BYTE] * 256)]
    return tokens, types


def _tensors() -> list[tuple[str, np.ndarray]]:
    """Each tensor as numpy holds it (rows, columns); GGUF lists its dimensions the other way round."""
    rng = np.random.default_rng(SEED)
    vocab = len(_vocabulary()[0])

    def weight(rows: int, columns: int) -> np.ndarray:
        return (rng.standard_normal((rows, columns)) * 0.02).astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones(EMBEDDING, dtype=np.float32)

    tensors = [("token_embd.weight", weight(vocab, EMBEDDING)), ("output_norm.weight", norm())]
    tensors.append(("output.weight", weight(vocab, EMBEDDING)))
    for block in range(BLOCKS):
        name = f"blk.{block}."
        tensors += [
            (name + "attn_norm.weight", norm()),
            (name + "attn_q.weight", weight(EMBEDDING, EMBEDDING)),
            (name + "attn_k.weight", weight(EMBEDDING, EMBEDDING)),
            (name + "attn_v.weight", weight(EMBEDDING, EMBEDDING)),
            (name + "attn_output.weight", weight(EMBEDDING, EMBEDDING)),
            (name + "ffn_norm.weight", norm()),
            (name + "ffn_gate.weight", weight(FEED_FORWARD, EMBEDDING)),
            (name + "ffn_up.weight", weight(FEED_FORWARD, EMBEDDING)),
            (name + "ffn_down.weight", weight(EMBEDDING, FEED_FORWARD)),
        ]
    return tensors


def _pad(size: int) -> int:
    return (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def gguf_bytes() -> bytes:
    """The check model's file, the same bytes on every node."""
    tokens, types = _vocabulary()
    keys: list[tuple[str, int, Value, int]] = [
        ("general.architecture", _STRING, "llama", 0),
        ("general.name", _STRING, "llmgw build check", 0),
        ("llama.context_length", _UINT32, CONTEXT, 0),
        ("llama.embedding_length", _UINT32, EMBEDDING, 0),
        ("llama.block_count", _UINT32, BLOCKS, 0),
        ("llama.feed_forward_length", _UINT32, FEED_FORWARD, 0),
        ("llama.attention.head_count", _UINT32, HEADS, 0),
        ("llama.attention.head_count_kv", _UINT32, HEADS, 0),
        ("llama.attention.layer_norm_rms_epsilon", _FLOAT32, 1e-5, 0),
        ("llama.rope.dimension_count", _UINT32, EMBEDDING // HEADS, 0),
        ("llama.vocab_size", _UINT32, len(tokens), 0),
        ("tokenizer.ggml.model", _STRING, "llama", 0),
        ("tokenizer.ggml.tokens", _ARRAY, tokens, _STRING),
        ("tokenizer.ggml.scores", _ARRAY, [0.0] * len(tokens), _FLOAT32),
        ("tokenizer.ggml.token_type", _ARRAY, types, _INT32),
        ("tokenizer.ggml.unknown_token_id", _UINT32, 0, 0),
        ("tokenizer.ggml.bos_token_id", _UINT32, 1, 0),
        ("tokenizer.ggml.eos_token_id", _UINT32, 2, 0),
    ]
    tensors = _tensors()
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(keys)))
    for key, kind, value, element in keys:
        out += _string(key) + struct.pack("<I", kind) + _value(kind, value, element)
    offset = 0
    for name, array in tensors:
        kind = _GGML_F16 if array.dtype == np.float16 else _GGML_F32
        out += _string(name) + struct.pack("<I", array.ndim)
        out += b"".join(struct.pack("<Q", size) for size in reversed(array.shape))
        out += struct.pack("<IQ", kind, offset)
        offset += _pad(array.nbytes)
    out += bytes(_pad(len(out)) - len(out))
    for _name, array in tensors:
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        out += data + bytes(_pad(len(data)) - len(data))
    return bytes(out)


def write_check_model(directory: Path) -> Path:
    """The check model in ``directory`` (written whole: a temporary file renamed into place)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / FILENAME
    data = gguf_bytes()
    if target.is_file() and target.stat().st_size == len(data) and target.read_bytes() == data:
        return target
    partial = directory / f".{FILENAME}.{os.getpid()}.partial"
    partial.write_bytes(data)
    os.replace(partial, target)
    return target
