"""Weights on a node's disk: files reused only when their sha256 matches, model folders by content.

Each mirrored file lives at ``weights/<sha256>/<filename>``. A file found
there by name is reused only when its bytes hash to that sha256: the digest,
once checked, is kept beside it in ``<filename>.sha256`` with the file's size
and modification time, so a multi-GB file is hashed once, not at every start,
and hashed again when it changed.

A safetensors repository (or a PEFT adapter) is a folder of several files.
Its folder, ``weights/models/<digest>/``, is named by the sha256 of its
files' names and digests and holds hard links to them (symbolic links where
the filesystem refuses hard ones). Two models that share base weights and
differ in a ``config.json`` or a tokenizer get a folder each, and never write
over each other's files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from llmgw.mirror.blobs import hash_file, normalize_sha256

log = logging.getLogger(__name__)

DIGEST_SUFFIX = ".sha256"
MODELS_DIR = "models"


def digest_file(path: Path) -> Path:
    """Where the checked digest of ``path`` is kept."""
    return path.with_name(path.name + DIGEST_SUFFIX)


def remember_digest(path: Path, sha256: str) -> None:
    """Keep ``sha256`` as the checked digest of ``path`` as it is now (size and modification time)."""
    stat = path.stat()
    record = {"sha256": normalize_sha256(sha256), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    kept = digest_file(path)
    partial = kept.with_name(f".{kept.name}.partial")
    partial.write_text(json.dumps(record))
    os.replace(partial, kept)


def _remembered(path: Path) -> str:
    """The digest kept for ``path`` if the file is still as it was when checked; empty otherwise."""
    try:
        record = json.loads(digest_file(path).read_text())
        stat = path.stat()
    except (OSError, ValueError):
        return ""
    if not isinstance(record, dict):
        return ""
    if record.get("size") != stat.st_size or record.get("mtime_ns") != stat.st_mtime_ns:
        return ""
    return str(record.get("sha256", ""))


def reusable(path: Path, sha256: str) -> bool:
    """Whether the file at ``path`` holds the bytes of ``sha256``; one that does not is removed. Blocking.

    The kept digest answers when the file is unchanged since it was checked;
    otherwise the file is hashed (and the digest kept for next time).
    """
    if not path.is_file():
        return False
    expected = normalize_sha256(sha256)
    if _remembered(path) == expected:
        return True
    actual, _ = hash_file(path)
    if actual == expected:
        remember_digest(path, expected)
        return True
    log.warning(
        "%s hashes to %s…, not the %s… expected: removing it to fetch it again",
        path,
        actual[:12],
        expected[:12],
    )
    path.unlink()
    digest_file(path).unlink(missing_ok=True)
    return False


def folder_digest(files: Sequence[tuple[str, str]]) -> str:
    """The sha256 naming a folder of ``(filename, sha256)`` files, whatever their order."""
    listing = "".join(f"{normalize_sha256(sha)} {name}\n" for name, sha in sorted(files))
    return hashlib.sha256(listing.encode()).hexdigest()


def model_folder(weights_dir: Path, files: Sequence[tuple[str, str, Path]]) -> Path:
    """The folder of links to ``files`` (name, sha256, path) in ``weights/models/<digest>/``; blocking.

    An existing folder is reused when each name links to its file; otherwise it is made again,
    out of sight first and then renamed into place.
    """
    folder = weights_dir / MODELS_DIR / folder_digest([(name, sha) for name, sha, _ in files])
    if _holds(folder, files):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    # a partial folder of its own: two shards taking the same adapter at once each make one
    partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".partial", dir=folder.parent))
    try:
        for name, _, path in files:
            target = partial / name
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except OSError:
                target.symlink_to(path.resolve())
        if folder.exists() and not _holds(folder, files):
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(partial, folder)
        except OSError:
            if not _holds(folder, files):  # another made it meanwhile: theirs is as good as this one
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def _holds(folder: Path, files: Sequence[tuple[str, str, Path]]) -> bool:
    """Whether ``folder`` links each name to its file."""
    return folder.is_dir() and all(_same(folder / name, path) for name, _, path in files)


def _same(link: Path, path: Path) -> bool:
    try:
        return link.samefile(path)
    except OSError:
        return False
