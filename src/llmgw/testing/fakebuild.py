"""A llama.cpp release archive small enough for tests: a ``llama-server`` that prints its version."""

from __future__ import annotations

import io
import tarfile

SCRIPT = b"#!/bin/sh\necho 'version: 1 (fake build)'\n"


def fake_llamacpp_archive() -> bytes:
    """A .tar.gz laid out like llama.cpp's release assets (``build/bin/llama-server``)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("build/bin/llama-server")
        info.size, info.mode = len(SCRIPT), 0o755
        tar.addfile(info, io.BytesIO(SCRIPT))
    return buffer.getvalue()
