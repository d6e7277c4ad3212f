"""Real files for the ComfyUI stand-in to save: PNG pictures and OBJ meshes with vertex colours.

A PNG is written with zlib (8-bit RGB, one filter byte per row), so any PNG
reader (Pillow, a browser, the openai SDK's users) opens it; its colours
follow the text it was made from, so two prompts give two pictures. An OBJ
is a coloured octahedron: ``v x y z r g b`` lines (colours 0..1, the
extension trimesh and MeshLab read) and triangular ``f`` faces.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def colour_of(text: str) -> tuple[int, int, int]:
    """A colour chosen by ``text``."""
    digest = hashlib.sha256(text.encode()).digest()
    return digest[0], digest[1], digest[2]


def png_bytes(width: int, height: int, text: str = "") -> bytes:
    """A ``width`` by ``height`` RGB picture: a gradient from the colour ``text`` chooses."""
    if not (0 < width <= 8192 and 0 < height <= 8192):
        raise ValueError(f"a picture of {width}x{height} is out of range")
    red, green, blue = colour_of(text)
    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter: none
        shade = (y * 255) // max(1, height - 1)
        row = bytes((red, (green + shade) % 256, blue))
        line = bytearray(row * width)
        for x in range(0, width, max(1, width // 16)):
            line[3 * x + 2] = (blue + (x * 255) // max(1, width - 1)) % 256
        rows += line
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        PNG_SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(bytes(rows), 6))
        + _chunk(b"IEND", b"")
    )


def png_size(data: bytes) -> tuple[int, int]:
    """The width and height a PNG's header gives."""
    if not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


_OCTAHEDRON = ((1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1))
_FACES = ((1, 3, 5), (3, 2, 5), (2, 4, 5), (4, 1, 5), (3, 1, 6), (2, 3, 6), (4, 2, 6), (1, 4, 6))


def obj_text(text: str = "") -> str:
    """A coloured octahedron as OBJ: each vertex its own colour, chosen by ``text``."""
    red, green, blue = colour_of(text)
    lines = ["# llmgw ComfyUI stand-in mesh"]
    for index, (x, y, z) in enumerate(_OCTAHEDRON):
        r, g, b = ((red + 40 * index) % 256, (green + 70 * index) % 256, (blue + 110 * index) % 256)
        lines.append(f"v {x:.6f} {y:.6f} {z:.6f} {r / 255:.6f} {g / 255:.6f} {b / 255:.6f}")
    lines += [f"f {a} {b} {c}" for a, b, c in _FACES]
    return "\n".join(lines) + "\n"
