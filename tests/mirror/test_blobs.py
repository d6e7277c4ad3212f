"""The mirror's content-addressed blob store."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from llmgw.errors import NotFound, StorageFull, ValidationFailed
from llmgw.mirror.blobs import BlobInfo, BlobStore

CONTENT = b"GGUF" + bytes(range(256)) * 5000
DIGEST = hashlib.sha256(CONTENT).hexdigest()


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "mirror")


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(CONTENT)
    return path


def blobs_in(store: BlobStore) -> list[Path]:
    return sorted(path for path in (store.root / "sha256").rglob("*") if path.is_file())


async def test_an_imported_file_is_stored_under_its_sha256(store: BlobStore, model_file: Path) -> None:
    info = await store.import_file(model_file)

    assert info == BlobInfo(sha256=DIGEST, size=len(CONTENT), filename="model.gguf")
    stored = store.root / "sha256" / DIGEST[:2] / DIGEST
    assert stored.read_bytes() == CONTENT
    assert store.path_of(DIGEST) == stored


async def test_a_stored_blob_is_read_only(store: BlobStore, model_file: Path) -> None:
    await store.import_file(model_file)

    assert store.path_of(DIGEST).stat().st_mode & 0o222 == 0


async def test_importing_the_same_file_twice_keeps_one_blob(store: BlobStore, model_file: Path) -> None:
    first = await store.import_file(model_file)
    second = await store.import_file(model_file)

    assert first == second
    assert blobs_in(store) == [store.path_of(DIGEST)]
    assert list((store.root / "tmp").iterdir()) == []


async def test_the_source_is_copied_so_editing_it_leaves_the_blob_alone(
    store: BlobStore, model_file: Path
) -> None:
    await store.import_file(model_file)
    with model_file.open("r+b") as handle:
        handle.write(b"XXXX")

    assert store.verify(DIGEST)


async def test_progress_is_reported_up_to_the_whole_size(store: BlobStore, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * (1 << 20) + 17))
    seen: list[tuple[int, int]] = []

    await store.import_file(big, progress=lambda done, total: seen.append((done, total)))

    size = big.stat().st_size
    assert seen[0] == (0, size)
    assert seen[-1] == (size, size)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


async def test_an_empty_file_is_a_blob_too(store: BlobStore, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")

    info = await store.import_file(empty)

    assert (info.sha256, info.size) == (hashlib.sha256(b"").hexdigest(), 0)
    assert store.has(info.sha256)


async def test_importing_a_missing_file_says_so(store: BlobStore, tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="no such file") as caught:
        await store.import_file(tmp_path / "nope.gguf")

    assert caught.value.hint


def test_a_missing_blob_is_not_found_with_a_hint_to_import_it(store: BlobStore) -> None:
    with pytest.raises(NotFound) as caught:
        store.path_of("ab" * 32)

    assert caught.value.hint == "import it with llmgw mirror import FILE"
    assert not store.has("ab" * 32)


async def test_digests_may_carry_a_prefix_and_capitals(store: BlobStore, model_file: Path) -> None:
    await store.import_file(model_file)

    assert store.has(f"sha256:{DIGEST.upper()}")


def test_a_malformed_digest_is_refused(store: BlobStore) -> None:
    with pytest.raises(ValidationFailed, match="not a sha256 digest"):
        store.has("../../etc/passwd")


async def test_chunks_are_read_from_an_offset(store: BlobStore, model_file: Path) -> None:
    await store.import_file(model_file)

    chunks = [chunk async for chunk in store.read_chunks(DIGEST, offset=1000, chunk_size=4096)]

    assert b"".join(chunks) == CONTENT[1000:]
    assert {len(chunk) for chunk in chunks[:-1]} == {4096}


async def test_reading_from_the_end_yields_nothing(store: BlobStore, model_file: Path) -> None:
    await store.import_file(model_file)

    assert [chunk async for chunk in store.read_chunks(DIGEST, offset=len(CONTENT))] == []


async def test_reading_past_the_end_is_refused(store: BlobStore, model_file: Path) -> None:
    await store.import_file(model_file)

    with pytest.raises(ValidationFailed, match="outside blob"):
        [chunk async for chunk in store.read_chunks(DIGEST, offset=len(CONTENT) + 1)]


async def test_verify_notices_a_damaged_blob(store: BlobStore, model_file: Path) -> None:
    await store.import_file(model_file)
    blob = store.path_of(DIGEST)
    assert store.verify(DIGEST)

    blob.chmod(0o644)
    with blob.open("r+b") as handle:
        handle.seek(100)
        handle.write(b"\xff")

    assert not store.verify(DIGEST)


async def test_a_damaged_blob_is_replaced_by_a_fresh_import_of_a_different_size(
    store: BlobStore, model_file: Path
) -> None:
    await store.import_file(model_file)
    blob = store.path_of(DIGEST)
    blob.chmod(0o644)
    blob.write_bytes(CONTENT[:10])

    await store.import_file(model_file)

    assert store.verify(DIGEST)


def test_a_crash_mid_import_leaves_no_blob_under_its_name(store: BlobStore, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(1 << 20) * 48)
    program = textwrap.dedent(
        f"""
        import asyncio, os
        from pathlib import Path
        from llmgw.mirror.blobs import BlobStore

        def crash(done, total):
            if done >= 1 << 20:
                os._exit(3)

        asyncio.run(BlobStore(Path({str(store.root)!r})).import_file(Path({str(big)!r}), progress=crash))
        """
    )

    result = subprocess.run([sys.executable, "-c", program], timeout=60)

    assert result.returncode == 3
    assert blobs_in(store) == []
    assert [path.suffix for path in (store.root / "tmp").iterdir()] == [".partial"]


def test_leftovers_are_removed_but_not_a_file_an_import_still_writes(store: BlobStore) -> None:
    tmp = store.root / "tmp"
    tmp.mkdir(parents=True)
    crashed, writing = tmp / "crashed.partial", tmp / "writing.partial"
    crashed.write_bytes(b"x")
    old_upload = store.root / ".upload-abc123"
    old_upload.write_bytes(b"z")
    with writing.open("wb") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # as a running import holds its file

        assert store.remove_leftovers() == 2
        assert sorted(path.name for path in tmp.iterdir()) == ["writing.partial"]
        assert not old_upload.exists()


async def chunks_of(data: bytes, size: int = 65536) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def test_a_streamed_upload_is_stored_under_its_sha256(store: BlobStore) -> None:
    info = await store.import_stream(chunks_of(CONTENT), "model.gguf", max_bytes=len(CONTENT))

    assert info == BlobInfo(DIGEST, len(CONTENT), "model.gguf")
    assert store.path_of(DIGEST).read_bytes() == CONTENT
    assert list((store.root / "tmp").iterdir()) == []


async def test_a_streamed_upload_past_its_limit_is_refused_and_leaves_nothing(store: BlobStore) -> None:
    with pytest.raises(ValidationFailed, match="limit of 1000 bytes") as refused:
        await store.import_stream(chunks_of(CONTENT, 600), "model.gguf", max_bytes=1000)

    assert "llmgw mirror import" in refused.value.hint
    assert blobs_in(store) == []
    assert list((store.root / "tmp").iterdir()) == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a real filesystem that fills up (the tests run as root, as CI does)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_a_full_disk_ends_an_import_with_507_and_keeps_nothing(small_disk: Path) -> None:
    store = BlobStore(small_disk / "mirror")

    with pytest.raises(StorageFull) as full:
        await store.import_stream(chunks_of(os.urandom(2 << 20)), "big.gguf")

    assert full.value.status == 507
    assert "is full" in full.value.message and "data_dir" in full.value.hint
    assert blobs_in(store) == []
    assert list((store.root / "tmp").iterdir()) == []
    info = await store.import_stream(chunks_of(b"small"), "small.gguf")  # the room came back
    assert store.path_of(info.sha256).read_bytes() == b"small"
