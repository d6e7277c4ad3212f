"""A small GGUF LoRA adapter for a GGUF model, written without numpy: real llama-server loads it.

llama.cpp reads a LoRA adapter from a GGUF file with ``general.type``
``adapter``, ``adapter.type`` ``lora``, ``adapter.lora.alpha``, the base
model's ``general.architecture``, and for each adapted tensor ``NAME`` of the
model a pair ``NAME.lora_a`` (``ne = [ne0 of NAME, rank]``) and ``NAME.lora_b``
(``ne = [rank, ne1 of NAME]``). :func:`write_lora` writes such a file, every
value one constant, so that applying it changes what the model says and not
applying it changes nothing. :func:`tensor_shapes` reads a GGUF's tensor
names and shapes (GGUF v3, little-endian) to know what to adapt.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

ALIGNMENT = 32
_F32 = 0
_STRING, _ARRAY, _FLOAT32 = 8, 9, 6
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _read(handle: BinaryIO, fmt: str) -> int | float:
    size = struct.calcsize("<" + fmt)
    value: int | float = struct.unpack("<" + fmt, handle.read(size))[0]
    return value


def _string(handle: BinaryIO) -> str:
    return handle.read(int(_read(handle, "Q"))).decode()


def _skip_value(handle: BinaryIO, kind: int) -> None:
    if kind == _STRING:
        _string(handle)
    elif kind == _ARRAY:
        inner, count = int(_read(handle, "I")), int(_read(handle, "Q"))
        if inner in _SCALARS:
            handle.seek(struct.calcsize("<" + _SCALARS[inner]) * count, 1)
        else:
            for _ in range(count):
                _skip_value(handle, inner)
    else:
        handle.seek(struct.calcsize("<" + _SCALARS[kind]), 1)


def tensor_shapes(model: Path) -> tuple[str, dict[str, tuple[int, ...]]]:
    """The model's architecture and each tensor's ``ne`` (innermost dimension first)."""
    with model.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ValueError(f"{model} is not a GGUF file")
        _read(handle, "I")
        tensors, kvs = int(_read(handle, "Q")), int(_read(handle, "Q"))
        architecture = ""
        for _ in range(kvs):
            key, kind = _string(handle), int(_read(handle, "I"))
            if key == "general.architecture" and kind == _STRING:
                architecture = _string(handle)
            else:
                _skip_value(handle, kind)
        shapes = {}
        for _ in range(tensors):
            name = _string(handle)
            dims = tuple(int(_read(handle, "Q")) for _ in range(int(_read(handle, "I"))))
            _read(handle, "I")
            _read(handle, "Q")
            shapes[name] = dims
    return architecture, shapes


def _put_string(out: bytearray, text: str) -> None:
    data = text.encode()
    out += struct.pack("<Q", len(data)) + data


def write_lora(
    path: Path, model: Path, targets: Iterable[str], *, rank: int = 4, alpha: float = 4.0, value: float = 0.05
) -> Path:
    """Write a LoRA adapter for ``model`` adapting each tensor named in ``targets``, every entry ``value``."""
    architecture, shapes = tensor_shapes(model)
    pairs: list[tuple[str, tuple[int, int]]] = []
    for name in targets:
        ne0, ne1 = shapes[name][:2]
        pairs += [(f"{name}.lora_a", (ne0, rank)), (f"{name}.lora_b", (rank, ne1))]
    header = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(pairs), 4))
    for key, text in (("general.type", "adapter"), ("general.architecture", architecture),
                      ("adapter.type", "lora")):  # fmt: skip
        _put_string(header, key)
        header += struct.pack("<I", _STRING)
        _put_string(header, text)
    _put_string(header, "adapter.lora.alpha")
    header += struct.pack("<If", _FLOAT32, alpha)
    offset = 0
    for name, (ne0, ne1) in pairs:
        _put_string(header, name)
        header += struct.pack("<IQQIQ", 2, ne0, ne1, _F32, offset)
        offset += -(-ne0 * ne1 * 4 // ALIGNMENT) * ALIGNMENT
    header += b"\0" * (-len(header) % ALIGNMENT)
    with path.open("wb") as out:
        out.write(header)
        for _name, (ne0, ne1) in pairs:
            size = ne0 * ne1 * 4
            out.write(struct.pack("<f", value) * (ne0 * ne1) + b"\0" * (-size % ALIGNMENT))
    return path
