"""A node installs a llama.cpp build from the mirror before the public release (C4.2)."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.agent.mirrorbuilds import MirrorBuildSource
from llmgw.core.mirrorbuilds import BuildAsset, MirrorBuilds, MirroredBuild
from llmgw.engines.builds import install_best, installed, llamacpp_builds
from llmgw.errors import BuildError
from llmgw.mirror.blobs import BlobStore
from llmgw.testing.standin_builds import fake_llamacpp_archive

UNREACHABLE = "http://127.0.0.1:9"
"""A release API nothing answers: the node is offline."""


@pytest.fixture
async def mirror(tmp_path: Path) -> tuple[BlobStore, MirrorBuilds]:
    (tmp_path / "a.tar.gz").write_bytes(fake_llamacpp_archive())
    blobs = BlobStore(tmp_path / "mirror")
    info = await blobs.import_file(tmp_path / "a.tar.gz")
    build = llamacpp_builds(has_nvidia=False, driver_version=None, arch="x86_64", tag="b1")[0]
    held = MirroredBuild(
        "llama.cpp", "b1", "cpu", "x64", (BuildAsset(build.assets[0], info.sha256, info.size),)
    )
    return blobs, MirrorBuilds((held,))


def source_of(blobs: BlobStore, fetched: list[str]) -> MirrorBuildSource:
    async def fetch(sha256: str, offset: int) -> AsyncIterator[bytes]:
        fetched.append(sha256)
        async for chunk in blobs.read_chunks(sha256, offset):
            yield chunk

    return MirrorBuildSource(lambda: fetch)


async def test_an_offline_node_installs_the_mirror_s_build(
    mirror: tuple[BlobStore, MirrorBuilds], tmp_path: Path
) -> None:
    blobs, held = mirror
    fetched: list[str] = []
    source = source_of(blobs, fetched)
    source.use(held)
    candidates = llamacpp_builds(has_nvidia=False, driver_version=None, arch="x86_64", tag="b1")
    result = await install_best(
        candidates, tmp_path / "cache", check=None, release_api=UNREACHABLE, mirror=source
    )
    assert result.build.variant == "cpu" and result.binary.is_file()
    assert fetched == [held.builds[0].assets[0].sha256]
    assert dict(result.sha256) == {held.builds[0].assets[0].name: held.builds[0].assets[0].sha256}
    assert [b.build.key for b in installed(tmp_path / "cache")] == ["b1-cpu"]


async def test_a_build_the_mirror_lacks_goes_on_to_the_release(
    mirror: tuple[BlobStore, MirrorBuilds], tmp_path: Path
) -> None:
    blobs, _ = mirror
    fetched: list[str] = []
    source = source_of(blobs, fetched)  # told of no builds
    release_build = llamacpp_builds(has_nvidia=False, driver_version=None, arch="x86_64", tag="b1")[0]
    with pytest.raises(BuildError, match="cannot read"):
        await install_best(
            [release_build], tmp_path / "cache", check=None, release_api=UNREACHABLE, mirror=source
        )
    assert fetched == []


def test_only_the_same_archives_count_as_the_same_build(mirror: tuple[BlobStore, MirrorBuilds]) -> None:
    blobs, held = mirror
    source = source_of(blobs, [])
    source.use(held)
    cpu = llamacpp_builds(has_nvidia=False, driver_version=None, arch="x86_64", tag="b1")
    assert source.find(cpu[0]) == held.builds[0]
    assert source.find(cpu[1]) is None  # the source build
    other_tag = llamacpp_builds(has_nvidia=False, driver_version=None, arch="x86_64", tag="b2")[0]
    assert source.find(other_tag) is None
    arm = llamacpp_builds(has_nvidia=False, driver_version=None, arch="aarch64", tag="b1")[0]
    assert source.find(arm) is None
