"""Engine builds from the control plane's mirror: tried before the public release (C4.2).

The control plane tells each node, as it registers, the builds its mirror holds
(:class:`~llmgw.core.mirrorbuilds.MirrorBuilds`). When the node installs a
release build the mirror holds too (same engine, version, variant and
archives), its archives are fetched from the mirror, each checked against its
sha256, instead of from the project's release: an offline node installs its
engines this way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from llmgw.core.mirrorbuilds import MirrorBuilds, MirroredBuild
from llmgw.engines.builds import Build
from llmgw.mirror.fetching import BlobWriter

BlobFetcher = Callable[[str, int], AsyncIterator[bytes]]


class MirrorBuildSource:
    """The mirror's builds as last told, and fetching one's archives (a ``MirrorSource`` of builds)."""

    def __init__(self, fetch: Callable[[], BlobFetcher]) -> None:
        self._fetch = fetch
        self.builds = MirrorBuilds()

    def use(self, builds: MirrorBuilds) -> None:
        """The builds the control plane's mirror holds now."""
        self.builds = builds

    def find(self, build: Build) -> MirroredBuild | None:
        """The mirror's copy of a release build: same engine, version, variant and archives."""
        if build.kind != "release":
            return None
        for held in self.builds.builds:
            same = (held.engine, held.version, held.variant) == (build.engine, build.version, build.variant)
            if same and tuple(asset.name for asset in held.assets) == build.assets:
                return held
        return None

    def find_wheels(self, engine: str, version: str, variant: str, arch: str) -> MirroredBuild | None:
        """The mirror's wheelhouse of a Python engine's build (vLLM, SGLang) for this architecture."""
        for held in self.builds.builds:
            if (held.engine, held.version, held.variant, held.arch) == (engine, version, variant, arch):
                return held
        return None

    async def __call__(self, build: Build, downloads: Path) -> dict[str, tuple[Path, str]] | None:
        """``build``'s archives fetched into ``downloads`` and checked, by name; None when not held."""
        held = self.find(build)
        if held is None:
            return None
        return await self.fetch(held, downloads)

    async def fetch(self, held: MirroredBuild, downloads: Path) -> dict[str, tuple[Path, str]]:
        """``held``'s files fetched into ``downloads``, each checked against its sha256, by name."""
        await asyncio.to_thread(downloads.mkdir, parents=True, exist_ok=True)
        archives = {}
        for asset in held.assets:
            writer = BlobWriter(downloads / asset.name, asset.sha256, asset.size)
            offset = await writer.start()
            try:
                async for chunk in self._fetch()(asset.sha256, offset):
                    await writer.write(chunk)
                archives[asset.name] = (await writer.finish(), asset.sha256)
            except BaseException:
                await writer.close()
                raise
        return archives
