"""Offline bundles: made from a verified release, the mirror's builds and models; checked whole on import."""

import re
import tarfile
from pathlib import Path

import pytest

from llmgw.core.catalog import parse_model
from llmgw.core.mirrorbuilds import BuildAsset, MirroredBuild
from llmgw.errors import UntrustedRelease
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.builds import BuildIndex
from llmgw.mirror.bundles import (
    MANIFEST,
    BundleModel,
    check_bundle,
    create_bundle,
    import_bundle,
    unpack_bundle,
)
from llmgw.mirror.releases import write_release
from llmgw.pki.signing import generate_signing_key
from llmgw.testing.standin_builds import fake_llamacpp_archive

WHEEL = "llmgw-3.0.0-py3-none-any.whl"
ASSET = "llama-b1-bin-ubuntu-x64.tar.gz"


class Source:
    """An online control plane's mirror (a build, a model's weights) and a signed release."""

    def __init__(self, tmp_path: Path) -> None:
        generate_signing_key(tmp_path / "release.key", tmp_path / "trusted.pub")
        self.key = (tmp_path / "trusted.pub").read_bytes()
        (tmp_path / WHEEL).write_bytes(b"release three")
        self.release = tmp_path / "release"
        write_release(self.release, tmp_path / WHEEL, tmp_path / "release.key")
        self.blobs = BlobStore(tmp_path / "online" / "mirror")
        self.index = BuildIndex(self.blobs.root)
        self.tmp = tmp_path

    async def fill(self) -> BundleModel:
        (self.tmp / ASSET).write_bytes(fake_llamacpp_archive())
        archive = await self.blobs.import_file(self.tmp / ASSET)
        self.index.add(
            MirroredBuild("llama.cpp", "b1", "cpu", "x64", (BuildAsset(ASSET, archive.sha256, archive.size),))
        )
        (self.tmp / "model.gguf").write_bytes(b"GGUF weights")
        weights = await self.blobs.import_file(self.tmp / "model.gguf")
        return BundleModel("tiny", parse_model({"name": "tiny", "source": {"sha256": weights.sha256}}))


@pytest.fixture
async def made(tmp_path: Path) -> tuple[Source, BundleModel]:
    source = Source(tmp_path)
    return source, await source.fill()


def offline(tmp_path: Path) -> tuple[BlobStore, BuildIndex]:
    blobs = BlobStore(tmp_path / "offline" / "mirror")
    return blobs, BuildIndex(blobs.root)


@pytest.mark.parametrize("tar", [False, True])
async def test_a_bundle_round_trips_into_an_offline_mirror(
    made: tuple[Source, BundleModel], tmp_path: Path, tar: bool
) -> None:
    source, model = made
    out = tmp_path / ("bundle.tar" if tar else "bundle")
    path, digest = create_bundle(
        out, source.release, source.key, source.blobs, source.index, [model], tar=tar
    )
    assert path.is_file() if tar else path.is_dir()
    checked = check_bundle(unpack_bundle(path, tmp_path / "unpacked"), digest, source.key)
    assert checked.release.version == "3.0.0" and checked.models == ["tiny"]
    blobs, index = offline(tmp_path)
    release_dir = await import_bundle(checked, blobs, index)
    assert index.all() == source.index.all()
    assert blobs.has(model.definition.source.sha256)
    assert blobs.has(source.index.all()[0].assets[0].sha256)
    assert (release_dir / WHEEL).read_bytes() == b"release three"


def tamper(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "victim", [f"release/{WHEEL}", "release/SHA256SUMS", f"builds/{ASSET}", "blobs", MANIFEST]
)
async def test_one_changed_byte_anywhere_refuses_the_whole_bundle(
    made: tuple[Source, BundleModel], tmp_path: Path, victim: str
) -> None:
    source, model = made
    path, digest = create_bundle(
        tmp_path / "bundle", source.release, source.key, source.blobs, source.index, [model]
    )
    target = next((path / "blobs").iterdir()) if victim == "blobs" else path / victim
    tamper(target)
    with pytest.raises(UntrustedRelease, match="was altered") as refused:
        check_bundle(path, digest, source.key)
    assert str(target) in refused.value.message


async def test_one_changed_byte_in_a_tar_refuses_it_before_the_mirror_sees_anything(
    made: tuple[Source, BundleModel], tmp_path: Path
) -> None:
    source, model = made
    path, digest = create_bundle(
        tmp_path / "bundle.tar", source.release, source.key, source.blobs, source.index, [model], tar=True
    )
    with tarfile.open(path) as archive:
        member = archive.getmember(f"builds/{ASSET}")
        offset = member.offset_data
    data = bytearray(path.read_bytes())
    data[offset + 10] ^= 1
    path.write_bytes(bytes(data))
    blobs, index = offline(tmp_path)
    with pytest.raises(UntrustedRelease, match=re.escape(f"builds/{ASSET} was altered")):
        check_bundle(unpack_bundle(path, tmp_path / "unpacked"), digest, source.key)
    assert not blobs.root.exists() and index.all() == []


async def test_a_wrong_manifest_digest_an_extra_file_or_another_key_is_refused(
    made: tuple[Source, BundleModel], tmp_path: Path
) -> None:
    source, model = made
    path, digest = create_bundle(
        tmp_path / "bundle", source.release, source.key, source.blobs, source.index, [model]
    )
    with pytest.raises(UntrustedRelease, match=r"manifest\.json was altered"):
        check_bundle(path, "0" * 64, source.key)
    generate_signing_key(tmp_path / "other.key", tmp_path / "other.pub")
    with pytest.raises(UntrustedRelease, match="does not trust"):
        check_bundle(path, digest, (tmp_path / "other.pub").read_bytes())
    (path / "blobs" / "extra").write_bytes(b"smuggled")
    with pytest.raises(UntrustedRelease, match="is not in the bundle's manifest"):
        check_bundle(path, digest, source.key)


async def test_an_unverified_release_is_never_bundled(
    made: tuple[Source, BundleModel], tmp_path: Path
) -> None:
    source, model = made
    tamper(source.release / WHEEL)
    with pytest.raises(UntrustedRelease, match="was altered"):
        create_bundle(tmp_path / "bundle", source.release, source.key, source.blobs, source.index, [model])
    assert not (tmp_path / "bundle").exists()
