"""The client's uploads into the mirror and the definitions they complete, over a stand-in admin API."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pytest

from llmgw.adminapi.schemas import BlobImported
from llmgw.client.admin import AdminClient
from llmgw.client.definitions import PLACEHOLDER_SHA, definition, fill_checksums
from llmgw.client.uploads import upload_file
from llmgw.errors import ValidationFailed


class MirrorStandin(AdminClient):
    """Takes uploads in chunks of ``chunk`` bytes, as the real client sends them, and keeps them by name."""

    def __init__(self, chunk: int = 4) -> None:
        super().__init__("http://127.0.0.1:9", "token")
        self.chunk = chunk
        self.held: dict[str, bytes] = {}

    def upload_blob(
        self, filename: str, data: BinaryIO, length: int, progress: Callable[[int], None] | None = None
    ) -> BlobImported:
        body = b""
        while piece := data.read(self.chunk):
            body += piece
            if progress:
                progress(len(piece))
        assert len(body) == length
        self.held[filename] = body
        return BlobImported(sha256=hashlib.sha256(body).hexdigest(), size=len(body), filename=filename)


def test_an_upload_tells_its_progress_from_nothing_sent_to_all_of_it(tmp_path: Path) -> None:
    file = tmp_path / "tiny.gguf"
    file.write_bytes(b"GGUF" + b"x" * 6)
    told: list[tuple[str, int, int]] = []
    admin = MirrorStandin(chunk=4)
    blob = upload_file(admin, file, filename="kept.gguf", progress=lambda *a: told.append(a))
    assert told == [("kept.gguf", 0, 10), ("kept.gguf", 4, 10), ("kept.gguf", 8, 10), ("kept.gguf", 10, 10)]
    assert blob.sha256 == hashlib.sha256(file.read_bytes()).hexdigest()
    assert admin.held == {"kept.gguf": file.read_bytes()}


def test_a_path_that_is_no_file_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    admin = MirrorStandin()
    told: list[tuple[str, int, int]] = []
    with pytest.raises(ValidationFailed, match="is not a readable file"):
        upload_file(admin, tmp_path / "missing.gguf", progress=lambda *a: told.append(a))
    assert admin.held == {} and told == []


def test_the_uploads_fill_in_every_checksum_of_the_definition(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF model")
    projector = tmp_path / "mmproj.gguf"
    projector.write_bytes(b"GGUF projector")
    data, uploads = definition(
        model, name=None, fmt=None, engine=None, projector=projector, profile={}, replicas={}, on_demand=False
    )
    assert data["source"]["sha256"] == data["source"]["projector"]["sha256"] == PLACEHOLDER_SHA
    finished: list[str] = []
    fill_checksums(
        data,
        uploads,
        MirrorStandin(),
        lambda name, sent, size: finished.append(name) if sent == size else None,
    )
    assert data["source"]["sha256"] == hashlib.sha256(b"GGUF model").hexdigest()
    assert data["source"]["size"] == len(b"GGUF model")
    assert data["source"]["projector"]["sha256"] == hashlib.sha256(b"GGUF projector").hexdigest()
    assert finished == ["m.gguf", "mmproj.gguf"]
