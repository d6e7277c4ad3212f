"""Hugging Face repositories: names, the hub's listing and checksums, and snapshots on disk.

The hub (``mirror.hf_endpoint``, ``https://huggingface.co`` by default) lists a
revision's files with ``GET /api/models/{repo}/tree/{rev}?recursive=true``
(pages chained by ``Link: <...>; rel="next"``): each file has ``path``,
``size``, ``oid`` (its git blob sha1) and, for a file kept in LFS, ``lfs.oid``
(its sha256) and ``lfs.size``. ``GET /api/models/{repo}/revision/{rev}`` says
the commit (``sha``) a branch or tag stands for. A file's bytes come from
``/{repo}/resolve/{commit}/{path}`` (``Range`` honoured; ``X-Repo-Commit`` and,
for LFS files, ``X-Linked-Etag`` naming the sha256). A gated or private
repository answers 401/403 without ``Authorization: Bearer <HF_TOKEN>``
(``X-Error-Code: GatedRepo`` or ``RepoNotFound``).

A small file kept in git has no sha256 on the hub, only its git blob sha1
(``sha1("blob <size>\\0" + bytes)``): that is what it is checked against.

On disk, huggingface_hub's cache keeps ``models--ORG--NAME/snapshots/REV/FILE``
as links into ``blobs/``, each blob named by the hub's checksum of it (sha256
for LFS files, git sha1 for the rest); a plain snapshot folder (``local_dir``)
carries no checksum at all.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from llmgw.errors import ChecksumMismatch, ValidationFailed
from llmgw.mirror.blobs import CHUNK_SIZE, hash_file

DEFAULT_ENDPOINT = "https://huggingface.co"
"""The hub's address when neither ``mirror.hf_endpoint`` nor ``HF_ENDPOINT`` says another."""

_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHA1 = re.compile(r"[0-9a-f]{40}")

KEPT_SUFFIXES = (".safetensors", ".json", ".model", ".tiktoken", ".jinja", ".txt")
"""The files of a repository a safetensors engine reads: weights, config, tokenizer, chat template."""

SKIPPED_NAMES = frozenset({"README.md", ".gitattributes", "LICENSE.txt", "USE_POLICY.txt"})


@dataclass(frozen=True)
class RepoRef:
    """``ORG/REPO`` at a revision (branch, tag or commit)."""

    repo: str
    revision: str = "main"

    def __str__(self) -> str:
        return f"hf:{self.repo}@{self.revision}"


def parse_ref(text: str) -> RepoRef:
    """``ORG/REPO[@REVISION]`` (an ``hf:`` prefix is dropped), or ValidationFailed."""
    body = text.removeprefix("hf:")
    repo, _, revision = body.partition("@")
    if not _REPO.fullmatch(repo) or "--" in repo or (revision == "" and body.endswith("@")):
        raise ValidationFailed(
            [("source", f"{text!r} is not a Hugging Face repository")],
            "write it as hf:ORG/REPO or hf:ORG/REPO@REVISION (a branch, tag or commit)",
        )
    return RepoRef(repo, revision or "main")


@dataclass(frozen=True)
class RemoteFile:
    """One file of a revision as the hub lists it."""

    path: str
    size: int
    git_sha1: str
    sha256: str | None
    """From ``lfs.oid``; None for a file kept in git (checked by ``git_sha1``)."""


def kept(path: str) -> bool:
    """Whether a repository's file is one an engine reads (top-level weights, config, tokenizer)."""
    return "/" not in path and path not in SKIPPED_NAMES and path.endswith(KEPT_SUFFIXES)


def parse_tree(entries: Any) -> list[RemoteFile]:
    """The files of one page of the tree API's answer; ValidationFailed on an answer of another shape."""
    if not isinstance(entries, list):
        raise _bad_answer("the tree listing is not a JSON array")
    files = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("type") != "file":
            continue
        path, size, oid = entry.get("path"), entry.get("size"), entry.get("oid")
        if not isinstance(path, str) or not isinstance(size, int) or not isinstance(oid, str):
            raise _bad_answer(f"a tree entry lacks path, size or oid: {str(entry)[:200]}")
        lfs = entry.get("lfs")
        sha256 = None
        if isinstance(lfs, dict):
            sha256 = str(lfs.get("oid", "")).lower()
            if not _SHA256.fullmatch(sha256):
                raise _bad_answer(f"{path}: lfs.oid {lfs.get('oid')!r} is not a sha256")
            size = int(lfs.get("size", size))
        files.append(RemoteFile(path, size, oid.lower(), sha256))
    return files


def _bad_answer(why: str) -> ValidationFailed:
    return ValidationFailed(
        [("hub", why)], "check that mirror.hf_endpoint names a Hugging Face hub (https://huggingface.co)"
    )


def tree_url(endpoint: str, ref: RepoRef, commit: str) -> str:
    return f"{endpoint.rstrip('/')}/api/models/{ref.repo}/tree/{quote(commit, safe='')}?recursive=true"


def revision_url(endpoint: str, ref: RepoRef) -> str:
    return f"{endpoint.rstrip('/')}/api/models/{ref.repo}/revision/{quote(ref.revision, safe='')}"


def resolve_url(endpoint: str, ref: RepoRef, commit: str, path: str) -> str:
    return f"{endpoint.rstrip('/')}/{ref.repo}/resolve/{quote(commit, safe='')}/{quote(path)}"


def next_page(link_header: str) -> str | None:
    """The ``rel="next"`` address of a ``Link`` header, or None."""
    for part in link_header.split(","):
        match = re.match(r'\s*<([^>]+)>\s*;\s*rel="?next"?', part)
        if match:
            return match.group(1)
    return None


def git_blob_sha1(path: Path) -> str:
    """The git blob sha1 of a file (what the hub names a file kept in git by); blocking."""
    digest = hashlib.sha1(usedforsecurity=False)
    digest.update(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as source:
        while chunk := source.read(CHUNK_SIZE):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class LocalFile:
    """A file of a snapshot on disk and the checksum the hub named it by (if the folder says one)."""

    name: str
    path: Path
    sha256: str | None = None
    git_sha1: str | None = None

    @property
    def checked_by(self) -> str:
        if self.sha256:
            return "sha256 (hub)"
        if self.git_sha1:
            return "git sha1 (hub)"
        return "none: no hub checksum was available"


def snapshot_folder(directory: Path) -> Path:
    """The snapshot a folder stands for: itself, or a cache entry's (``refs/main``, else its only one)."""
    snapshots = directory / "snapshots"
    if not snapshots.is_dir():
        return directory
    main = directory / "refs" / "main"
    if main.is_file() and (snapshots / main.read_text().strip()).is_dir():
        return snapshots / main.read_text().strip()
    found = sorted(p for p in snapshots.iterdir() if p.is_dir())
    if len(found) != 1:
        raise ValidationFailed(
            [("DIR", f"{directory} holds {len(found)} snapshots and no refs/main")],
            "give the snapshot's own folder: DIR/snapshots/<revision>",
        )
    return found[0]


def local_files(directory: Path) -> list[LocalFile]:
    """The files of a snapshot folder or hub cache entry to import, each with the hub's checksum if known."""
    if not directory.is_dir():
        raise ValidationFailed(
            [("DIR", f"{directory} is not a folder")],
            "give a Hugging Face snapshot folder or a hub cache entry (models--ORG--NAME)",
        )
    snapshot = snapshot_folder(directory)
    files = []
    for entry in sorted(snapshot.iterdir()):
        if not kept(entry.name) or not entry.is_file():
            continue
        blob_name = entry.resolve().name if entry.is_symlink() else ""
        files.append(
            LocalFile(
                entry.name,
                entry,
                sha256=blob_name if _SHA256.fullmatch(blob_name) else None,
                git_sha1=blob_name if _SHA1.fullmatch(blob_name) else None,
            )
        )
    if not any(f.name.endswith(".safetensors") for f in files) or not any(
        f.name == "config.json" for f in files
    ):
        raise ValidationFailed(
            [("DIR", f"{snapshot} holds no .safetensors weights with a config.json")],
            "give the folder of a safetensors repository (weights, config, tokenizer)",
        )
    return files


def safetensors_source(files: list[tuple[str, str, int]]) -> dict[str, Any]:
    """A catalog source (``format: safetensors``) from (name, sha256, size) triples; weights first by name."""
    ordered = sorted(files)
    weights = next(f for f in ordered if f[0].endswith(".safetensors"))
    rest = [f for f in ordered if f != weights]
    return {
        "format": "safetensors",
        "filename": weights[0],
        "sha256": weights[1],
        "size": weights[2],
        "files": [{"filename": n, "sha256": s, "size": z} for n, s, z in rest],
    }


def check_local(file: LocalFile) -> tuple[str, int]:
    """(sha256, size) of a snapshot's file, checked against the hub's checksum when the folder names one;
    ChecksumMismatch naming the file when the bytes differ. Blocking."""
    actual, size = hash_file(file.path)
    if file.sha256 and actual != file.sha256:
        raise ChecksumMismatch(
            f"{file.name}: the hub named it sha256 {file.sha256}, its bytes hash to {actual}",
            "the cached copy is damaged: delete it and download it again (huggingface-cli download)",
        )
    if file.git_sha1 and (sha1 := git_blob_sha1(file.path)) != file.git_sha1:
        raise ChecksumMismatch(
            f"{file.name}: the hub named it git sha1 {file.git_sha1}, its bytes hash to {sha1}",
            "the cached copy is damaged: delete it and download it again (huggingface-cli download)",
        )
    return actual, size
