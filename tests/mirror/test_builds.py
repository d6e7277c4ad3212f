"""llama.cpp's release builds fetched into the mirror, checked against the release's digests."""

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from llmgw.errors import ChecksumMismatch, ValidationFailed
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.builds import BuildIndex, add_llamacpp_builds, llamacpp_targets, parse_engine
from llmgw.testing.standin_builds import fake_llamacpp_archive

TAG = "b1"
ASSET = "llama-b1-bin-ubuntu-x64.tar.gz"


@pytest.fixture
async def release_api() -> AsyncIterator[dict[str, str]]:
    """A stand-in for GitHub's release API; ``served["digest"]`` is what it publishes."""
    data = fake_llamacpp_archive()
    served = {"digest": "sha256:" + hashlib.sha256(data).hexdigest()}

    async def release(request: web.Request) -> web.Response:
        url = f"{served['base']}/download/{ASSET}"
        return web.json_response(
            {"assets": [{"name": ASSET, "digest": served["digest"], "browser_download_url": url}]}
        )

    async def asset(request: web.Request) -> web.Response:
        return web.Response(body=data)

    app = web.Application()
    app.router.add_get(f"/releases/tags/{TAG}", release)
    app.router.add_get(f"/download/{ASSET}", asset)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    served["base"] = f"http://127.0.0.1:{runner.addresses[0][1]}"
    served["sha256"] = hashlib.sha256(data).hexdigest()
    yield served
    await runner.cleanup()


async def test_a_build_is_fetched_checked_and_recorded(release_api: dict[str, str], tmp_path: Path) -> None:
    blobs, index = BlobStore(tmp_path / "mirror"), BuildIndex(tmp_path / "mirror")
    added = await add_llamacpp_builds(blobs, index, TAG, [("cpu", "x64")], release_api=release_api["base"])
    assert [b.key for b in added] == ["llama.cpp b1 cpu x64"]
    assert index.all() == added
    assert [a.name for a in added[0].assets] == [ASSET]
    assert blobs.has(release_api["sha256"]) and index.blobs() == {release_api["sha256"]}
    again = await add_llamacpp_builds(blobs, index, TAG, [("cpu", "x64")], release_api=release_api["base"])
    assert index.all() == again  # recorded once


async def test_an_archive_that_differs_from_the_published_digest_never_enters(
    release_api: dict[str, str], tmp_path: Path
) -> None:
    release_api["digest"] = "sha256:" + "0" * 64
    blobs, index = BlobStore(tmp_path / "mirror"), BuildIndex(tmp_path / "mirror")
    with pytest.raises(ChecksumMismatch):
        await add_llamacpp_builds(blobs, index, TAG, [("cpu", "x64")], release_api=release_api["base"])
    assert index.all() == [] and not blobs.has(release_api["sha256"])


def test_targets_and_engine_names() -> None:
    assert ("cuda-12.8", "x64") in llamacpp_targets(arch="x64")
    assert all(arch == "arm64" for _, arch in llamacpp_targets(arch="arm64"))
    assert llamacpp_targets("vulkan", "x64") == [("vulkan", "x64")]
    with pytest.raises(ValidationFailed, match=r"no cuda-12\.8 build for s390x"):
        llamacpp_targets("cuda-12.8", "s390x")
    assert parse_engine("llama.cpp@b9") == ("llama.cpp", "b9")
    with pytest.raises(ValidationFailed):
        parse_engine("vllm")
