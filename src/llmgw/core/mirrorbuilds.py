"""Engine builds held in the mirror, as the control plane tells its nodes (C4.2, C9.1).

A build is its engine, version, variant and architecture, and the archives it
is made of (llama.cpp's release assets), each in the mirror under its sha256.
A node installs a build from these archives before trying the public release,
so an offline cluster installs its engines.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BuildAsset:
    name: str
    """The archive's file name (llama.cpp's release asset name)."""
    sha256: str
    size: int


@dataclass(frozen=True)
class MirroredBuild:
    engine: str
    version: str
    variant: str
    arch: str
    assets: tuple[BuildAsset, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.engine} {self.version} {self.variant} {self.arch}"


@dataclass(frozen=True)
class MirrorBuilds:
    """Every engine build the mirror holds (sent to each node as it registers)."""

    builds: tuple[MirroredBuild, ...] = ()
