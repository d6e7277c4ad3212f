"""Offline bundles (C9.2): llmgw's signed release, every llama.cpp build and chosen models, checked whole.

A bundle is a directory, or a tar of one::

    manifest.json                 what the bundle holds, and every other file's sha256
    release/                      the signed release (wheel, SHA256SUMS, SHA256SUMS.sig)
    builds/<asset>                each llama.cpp build's archives, as the mirror holds them
    blobs/<sha256>                the chosen models' files (weights, projector, adapters), pinned

The manifest's own sha256 is carried apart (printed when the bundle is made):
importing checks that digest, the release's signature against the trusted
key, and every file's sha256 before anything enters the mirror; one changed
byte anywhere, a missing or an unlisted file refuses the whole bundle, naming
the file.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmgw.core.catalog import ModelDefinition
from llmgw.core.mirrorbuilds import MirroredBuild
from llmgw.errors import ConfigError, UntrustedRelease
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.builds import BuildIndex, build_of
from llmgw.mirror.releases import SIGNATURE, SUMS, Release, file_sha256, parse_sums, verify_release
from llmgw.runtime.files import write_public

MANIFEST = "manifest.json"
FORMAT = 1
"""The manifest's layout version."""
REFUSED_HINT = "make the bundle again from its source and carry it over again; import nothing from this one"


@dataclass(frozen=True)
class BundleModel:
    name: str
    definition: ModelDefinition


@dataclass(frozen=True)
class CheckedBundle:
    """A bundle whose every byte was checked: its folder, its manifest and its release."""

    root: Path
    manifest: dict[str, Any]
    release: Release

    @property
    def builds(self) -> list[MirroredBuild]:
        return [build_of(record) for record in self.manifest["builds"]]

    @property
    def models(self) -> list[str]:
        return [model["name"] for model in self.manifest["models"]]


def model_files(definition: ModelDefinition) -> list[tuple[str, str]]:
    """(sha256, file name) of every mirrored file a model runs from: weights, projector, adapters."""
    source = definition.source
    if source is None:  # served by its provider: nothing in the mirror
        return []
    found = [(source.sha256, source.filename)]
    if source.projector is not None:
        found.append((source.projector.sha256, source.projector.filename))
    found += [(f.sha256, f.filename) for f in source.files]
    for adapter in definition.adapters:
        found.append((adapter.sha256, adapter.filename or adapter.name))
        found += [(f.sha256, f.filename) for f in adapter.files]
    return found


def create_bundle(
    out: Path,
    release_dir: Path,
    trusted_public_key: bytes,
    blobs: BlobStore,
    index: BuildIndex,
    models: list[BundleModel],
    *,
    tar: bool = False,
) -> tuple[Path, str]:
    """Write a bundle at ``out`` (a directory, or with ``tar`` a tar file); (its path, the manifest's
    sha256). The release is verified first: a bundle never carries an unverified release."""
    release = verify_release(release_dir, trusted_public_key)
    if out.exists() and (out.is_file() or any(out.iterdir())):
        raise ConfigError(
            f"{out} exists already", hint="give a new path; a bundle is never written over another"
        )
    if not tar:
        return out, _write(out, release_dir, release, blobs, index, models)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".bundle-", dir=out.parent) as work:
        folder = Path(work) / "bundle"
        digest = _write(folder, release_dir, release, blobs, index, models)
        partial = out.with_name(f".{out.name}.partial")
        with tarfile.open(partial, "w") as archive:  # weights do not compress: plain tar
            for path in sorted(folder.rglob("*")):
                archive.add(path, arcname=str(path.relative_to(folder)), recursive=False)
        partial.replace(out)
    return out, digest


def _write(
    root: Path,
    release_dir: Path,
    release: Release,
    blobs: BlobStore,
    index: BuildIndex,
    models: list[BundleModel],
) -> str:
    files: dict[str, str] = {}

    def put(source: Path, relative: str, sha256: str) -> None:
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        files[relative] = sha256

    sums = parse_sums((release_dir / SUMS).read_bytes())
    for name, sha256 in sums.items():
        put(release_dir / name, f"release/{name}", sha256)
    for name in (SUMS, SIGNATURE):
        put(release_dir / name, f"release/{name}", file_sha256(release_dir / name))
    builds = index.all()
    for build in builds:
        for asset in build.assets:
            put(blobs.path_of(asset.sha256), f"builds/{asset.name}", asset.sha256)
    records = []
    for model in models:
        pinned = model_files(model.definition)
        for sha256, _ in pinned:
            put(blobs.path_of(sha256), f"blobs/{sha256}", sha256)
        records.append(
            {
                "name": model.name,
                "definition": model.definition.model_dump(mode="json", exclude_defaults=True),
                "files": [{"sha256": sha256, "filename": filename} for sha256, filename in pinned],
            }
        )
    manifest = {
        "format": FORMAT,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "llmgw": release.version,
        "builds": [asdict(build) for build in builds],
        "models": records,
        "files": dict(sorted(files.items())),
    }
    data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    write_public(root / MANIFEST, data)
    return hashlib.sha256(data).hexdigest()


def unpack_bundle(path: Path, into: Path) -> Path:
    """The bundle's folder: ``path`` itself, or a tar unpacked into ``into`` (no links, nothing outside)."""
    if path.is_dir():
        return path
    try:
        with tarfile.open(path) as archive:
            for member in archive.getmembers():
                if not (member.isfile() or member.isdir()):
                    raise UntrustedRelease(
                        f"{path} holds {member.name}, which is not a plain file", hint=REFUSED_HINT
                    )
            archive.extractall(into, filter="data")
    except (tarfile.TarError, OSError) as error:
        raise UntrustedRelease(
            f"{path} is not a bundle (a directory or a tar): {error}", REFUSED_HINT
        ) from error
    return into


def check_bundle(root: Path, manifest_sha256: str, trusted_public_key: bytes) -> CheckedBundle:
    """Check a bundle's folder whole: the manifest's digest, every file, the release's signature."""
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise UntrustedRelease(f"{root} holds no {MANIFEST}: it is not a bundle", hint=REFUSED_HINT)
    data = manifest_path.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != manifest_sha256.strip().lower().removeprefix("sha256:"):
        raise UntrustedRelease(
            f"{manifest_path} was altered: its sha256 is {actual}, not the {manifest_sha256} given",
            hint="give the digest printed when the bundle was made; if it is that one, " + REFUSED_HINT,
        )
    try:
        manifest = json.loads(data)
        files: dict[str, str] = dict(manifest["files"])
        builds = [build_of(record) for record in manifest["builds"]]
        pinned = [f["sha256"] for model in manifest["models"] for f in model["files"]]
    except (ValueError, KeyError, TypeError) as error:
        raise UntrustedRelease(f"{manifest_path} cannot be read: {error}", hint=REFUSED_HINT) from error
    present = {
        str(path.relative_to(root)) for path in root.rglob("*") if path.is_file() or path.is_symlink()
    } - {MANIFEST}
    unlisted = sorted(present - set(files))
    if unlisted:
        raise UntrustedRelease(f"{root / unlisted[0]} is not in the bundle's manifest", hint=REFUSED_HINT)
    for relative, expected in sorted(files.items()):
        path = root / relative
        if ".." in Path(relative).parts or path.is_symlink() or not path.is_file():
            raise UntrustedRelease(f"{path} is missing from the bundle (its manifest lists it)", REFUSED_HINT)
        actual = file_sha256(path)
        if actual != expected:
            raise UntrustedRelease(
                f"{path} was altered: its sha256 is {actual}, the manifest says {expected}", REFUSED_HINT
            )
    for build in builds:
        for asset in build.assets:
            if files.get(f"builds/{asset.name}") != asset.sha256:
                raise UntrustedRelease(f"build {build.key}: {asset.name} is not in the bundle", REFUSED_HINT)
    for sha256 in pinned:
        if files.get(f"blobs/{sha256}") != sha256:
            raise UntrustedRelease(f"model file {sha256[:12]}… is not in the bundle", REFUSED_HINT)
    release = verify_release(root / "release", trusted_public_key)
    return CheckedBundle(root, manifest, release)


async def import_bundle(bundle: CheckedBundle, blobs: BlobStore, index: BuildIndex) -> Path:
    """Put a checked bundle into the mirror: builds and model files as blobs (builds recorded), the
    release under ``<mirror>/releases/<version>/``; returns the release's folder there."""
    for build in bundle.builds:
        for asset in build.assets:
            await blobs.import_file(bundle.root / "builds" / asset.name)
        index.add(build)
    for relative in sorted(bundle.manifest["files"]):
        if relative.startswith("blobs/"):
            await blobs.import_file(bundle.root / relative)
    target = blobs.root / "releases" / bundle.release.version
    for path in sorted((bundle.root / "release").iterdir()):
        await blobs.import_file(path)
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target / path.name)
    return target
