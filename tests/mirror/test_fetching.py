"""Writing a blob fetched from the mirror: resume, size and checksum checks."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from llmgw.errors import ChecksumMismatch, DownloadError
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.fetching import BlobWriter

CONTENT = bytes(range(256)) * 4096
DIGEST = hashlib.sha256(CONTENT).hexdigest()


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    return tmp_path / "models" / "model.gguf"


def partial_of(dest: Path) -> Path:
    return dest.with_name(dest.name + ".partial")


def contents(path: Path) -> bytes | None:
    """The file's bytes, or None when there is no such file."""
    return path.read_bytes() if path.is_file() else None


async def write_all(writer: BlobWriter, data: bytes, chunk: int = 65536) -> None:
    for start in range(0, len(data), chunk):
        await writer.write(data[start : start + chunk])


async def test_a_whole_download_lands_under_its_name(dest: Path) -> None:
    writer = BlobWriter(dest, DIGEST, len(CONTENT))
    assert await writer.start() == 0

    await write_all(writer, CONTENT)
    assert contents(dest) is None
    path = await writer.finish()

    assert path == dest
    assert contents(dest) == CONTENT
    assert contents(partial_of(dest)) is None


async def test_a_cut_download_resumes_where_it_stopped(dest: Path) -> None:
    first = BlobWriter(dest, DIGEST, len(CONTENT))
    await first.start()
    await write_all(first, CONTENT[:300_000])
    await first.close()

    second = BlobWriter(dest, DIGEST, len(CONTENT))
    offset = await second.start()
    await write_all(second, CONTENT[offset:])
    await second.finish()

    assert offset == 300_000
    assert contents(dest) == CONTENT


async def test_a_wrong_checksum_names_both_digests_and_removes_the_partial(dest: Path) -> None:
    damaged = b"\xff" + CONTENT[1:]
    actual = hashlib.sha256(damaged).hexdigest()
    writer = BlobWriter(dest, DIGEST, len(CONTENT))
    await writer.start()
    await write_all(writer, damaged)

    with pytest.raises(ChecksumMismatch) as caught:
        await writer.finish()

    assert DIGEST in str(caught.value) and actual in str(caught.value)
    assert "re-import" in caught.value.hint
    assert contents(partial_of(dest)) is None
    assert contents(dest) is None


async def test_a_short_download_keeps_the_partial_for_a_resume(dest: Path) -> None:
    writer = BlobWriter(dest, DIGEST, len(CONTENT))
    await writer.start()
    await write_all(writer, CONTENT[:1000])

    with pytest.raises(DownloadError, match="ended at 1000 of"):
        await writer.finish()

    assert contents(partial_of(dest)) == CONTENT[:1000]
    assert contents(dest) is None


async def test_more_bytes_than_expected_are_refused(dest: Path) -> None:
    writer = BlobWriter(dest, DIGEST, len(CONTENT))
    await writer.start()
    await write_all(writer, CONTENT)

    with pytest.raises(DownloadError, match="more than"):
        await writer.write(b"extra")

    assert contents(partial_of(dest)) is None


async def test_a_partial_larger_than_the_blob_is_started_over(dest: Path) -> None:
    dest.parent.mkdir(parents=True)
    partial_of(dest).write_bytes(CONTENT + b"stale tail")

    writer = BlobWriter(dest, DIGEST, len(CONTENT))

    assert await writer.start() == 0
    await write_all(writer, CONTENT)
    await writer.finish()
    assert contents(dest) == CONTENT


async def test_a_blob_is_fetched_from_the_store_with_a_resume(tmp_path: Path, dest: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(CONTENT)
    store = BlobStore(tmp_path / "mirror")
    info = await store.import_file(source)

    async with BlobWriter(dest, info.sha256, info.size) as first:
        async for chunk in store.read_chunks(info.sha256, chunk_size=100_000):
            await first.write(chunk)
            break
    async with BlobWriter(dest, info.sha256, info.size) as second:
        async for chunk in store.read_chunks(info.sha256, offset=second.offset, chunk_size=100_000):
            await second.write(chunk)
        await second.finish()

    assert contents(dest) == CONTENT
