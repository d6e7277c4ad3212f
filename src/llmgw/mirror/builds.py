"""Engine builds in the mirror: llama.cpp's release archives fetched once, recorded with their sha256.

``llmgw mirror add-build llama.cpp[@TAG] [--variant V] [--arch A]`` fetches
each archive of each chosen build from llama.cpp's release, checks it against
the sha256 the release publishes, imports it as a blob and records the build
in ``builds.json`` at the mirror's root. The control plane tells each node the
builds it holds (:class:`~llmgw.core.mirrorbuilds.MirrorBuilds`), any node may
fetch their archives, and a node installs from them before the public release
(C4.2), so an offline cluster installs its engines.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import aiohttp

from llmgw.core.mirrorbuilds import BuildAsset, MirrorBuilds, MirroredBuild
from llmgw.engines.builds import LLAMACPP, LLAMACPP_TAG, RELEASE_API, RELEASE_ASSETS
from llmgw.engines.sourcebuild import download, fetch_json
from llmgw.errors import ChecksumMismatch, ConfigError, DownloadError, ValidationFailed
from llmgw.mirror.blobs import BlobStore
from llmgw.runtime.files import write_public

BUILDS_FILE = "builds.json"
"""The builds the mirror holds, at its root."""

Say = Callable[[str], None]


class BuildIndex:
    """The engine builds recorded in a mirror (``<root>/builds.json``)."""

    def __init__(self, root: Path) -> None:
        self.path = root / BUILDS_FILE

    def all(self) -> list[MirroredBuild]:
        """Every recorded build; none when the file is absent. ConfigError when it cannot be read."""
        if not self.path.is_file():
            return []
        try:
            return [build_of(record) for record in json.loads(self.path.read_text())]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ConfigError(
                f"cannot read the mirror's builds from {self.path}: {error}",
                hint="add the builds again with 'llmgw mirror add-build' (it rewrites the file)",
            ) from error

    def message(self) -> MirrorBuilds:
        return MirrorBuilds(tuple(self.all()))

    def blobs(self) -> frozenset[str]:
        """The sha256 of every recorded build's archives: any node may fetch them (none when the
        file cannot be read: nodes then fetch only their replicas' files)."""
        try:
            return frozenset(asset.sha256 for build in self.all() for asset in build.assets)
        except ConfigError:
            return frozenset()

    def add(self, build: MirroredBuild) -> None:
        """Record ``build``, replacing one with the same engine, version, variant and architecture."""
        kept = [b for b in self.all() if b.key != build.key]
        kept.append(build)
        kept.sort(key=lambda b: b.key)
        write_public(self.path, (json.dumps([asdict(b) for b in kept], indent=2) + "\n").encode())


def build_of(record: dict[str, Any]) -> MirroredBuild:
    """A build from its JSON record (``builds.json``, a bundle's manifest); KeyError, TypeError or
    ValueError when it is not one."""
    return MirroredBuild(
        engine=str(record["engine"]),
        version=str(record["version"]),
        variant=str(record["variant"]),
        arch=str(record["arch"]),
        assets=tuple(BuildAsset(str(a["name"]), str(a["sha256"]), int(a["size"])) for a in record["assets"]),
    )


def llamacpp_targets(variant: str | None = None, arch: str | None = None) -> list[tuple[str, str]]:
    """The (variant, arch) pairs llama.cpp's release ships, narrowed to ``variant`` and ``arch``."""
    chosen = [(v, a) for v, a in RELEASE_ASSETS if variant in (None, v) and arch in (None, a)]
    if not chosen:
        known = ", ".join(f"{v}/{a}" for v, a in RELEASE_ASSETS)
        raise ValidationFailed(
            [("variant/arch", f"llama.cpp's release ships no {variant or '*'} build for {arch or '*'}")],
            hint=f"choose among {known}",
        )
    return chosen


def parse_engine(spec: str) -> tuple[str, str]:
    """``llama.cpp[@TAG]`` as (engine, tag)."""
    engine, _, tag = spec.partition("@")
    if engine != LLAMACPP:
        raise ValidationFailed(
            [("ENGINE", f"{engine!r}: the mirror holds builds of {LLAMACPP} only")],
            hint=f"give {LLAMACPP} or {LLAMACPP}@<release tag>",
        )
    return engine, tag or LLAMACPP_TAG


async def add_llamacpp_builds(
    blobs: BlobStore,
    index: BuildIndex,
    tag: str,
    targets: list[tuple[str, str]],
    *,
    release_api: str = RELEASE_API,
    session: aiohttp.ClientSession | None = None,
    say: Say = lambda line: None,
) -> list[MirroredBuild]:
    """Fetch each target's archives from llama.cpp's release ``tag``, checked, into the mirror."""
    url = f"{release_api.rstrip('/')}/releases/tags/{tag}"
    owned = session is None
    http = session or aiohttp.ClientSession()
    added = []
    try:
        document = await fetch_json(http, url)
        published = {asset.get("name"): asset for asset in document.get("assets", [])}
        for variant, arch in targets:
            assets = []
            for name in (n.format(tag=tag) for n in RELEASE_ASSETS[(variant, arch)]):
                asset = published.get(name)
                if asset is None:
                    raise DownloadError(
                        f"release {tag} has no asset {name}", hint="choose another tag or variant"
                    )
                digest = str(asset.get("digest") or "")
                if not digest.startswith("sha256:"):
                    raise ChecksumMismatch(
                        f"release asset {name} has no sha256 digest to verify it against",
                        hint="the mirror holds only verified builds; choose a newer release",
                    )
                sha256 = digest.removeprefix("sha256:").lower()
                if not blobs.has(sha256):
                    say(f"fetching {name}")
                    staged = blobs.root / "tmp" / "builds" / name
                    await download(http, urljoin(url, str(asset["browser_download_url"])), staged, sha256)
                    info = await blobs.import_file(staged)
                    staged.unlink(missing_ok=True)
                    if info.sha256 != sha256:
                        raise ChecksumMismatch(
                            f"{name} changed while it was imported", hint="add the build again"
                        )
                assets.append(BuildAsset(name, sha256, blobs.path_of(sha256).stat().st_size))
            build = MirroredBuild(LLAMACPP, tag, variant, arch, tuple(assets))
            index.add(build)
            added.append(build)
            say(f"added {build.key}")
    finally:
        if owned:
            await http.close()
    return added
