import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from llmgw.errors import ConfigError, UntrustedRelease
from llmgw.mirror.releases import (
    SIGNATURE,
    SUMS,
    check_release_address,
    fetch_release,
    file_sha256,
    verify_release,
    write_release,
)
from llmgw.pki.signing import generate_signing_key


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, bytes]:
    generate_signing_key(tmp_path / "release.key", tmp_path / "trusted.pub")
    return tmp_path / "release.key", (tmp_path / "trusted.pub").read_bytes()


@pytest.fixture
def release_dir(tmp_path: Path, keys: tuple[Path, bytes]) -> Path:
    wheel = tmp_path / "build" / "llmgw-1.2.3-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"PK\x03\x04 a wheel's bytes")
    write_release(tmp_path / "release", wheel, keys[0])
    return tmp_path / "release"


def test_a_signed_release_verifies(release_dir: Path, keys: tuple[Path, bytes]) -> None:
    release = verify_release(release_dir, keys[1])
    assert release.version == "1.2.3"
    assert release.wheel == release_dir / "llmgw-1.2.3-py3-none-any.whl"
    assert release.sha256 == file_sha256(release.wheel)
    assert (release_dir / SUMS).read_text() == f"{release.sha256}  llmgw-1.2.3-py3-none-any.whl\n"


def test_a_tampered_wheel_is_refused_naming_it(release_dir: Path, keys: tuple[Path, bytes]) -> None:
    wheel = release_dir / "llmgw-1.2.3-py3-none-any.whl"
    data = bytearray(wheel.read_bytes())
    data[5] ^= 1
    wheel.write_bytes(bytes(data))
    with pytest.raises(UntrustedRelease, match=r"llmgw\-1\.2\.3\-py3\-none\-any\.whl\ was\ altered"):
        verify_release(release_dir, keys[1])


def test_tampered_sums_are_refused(release_dir: Path, keys: tuple[Path, bytes]) -> None:
    sums = release_dir / SUMS
    text = sums.read_text()
    sums.write_text(("1" if text[0] == "0" else "0") + text[1:])
    with pytest.raises(UntrustedRelease, match="SHA256SUMS: the release's signature does not match"):
        verify_release(release_dir, keys[1])


def test_a_release_signed_by_another_key_is_refused(release_dir: Path, tmp_path: Path) -> None:
    generate_signing_key(tmp_path / "other.key", tmp_path / "other.pub")
    with pytest.raises(UntrustedRelease, match="does not trust"):
        verify_release(release_dir, (tmp_path / "other.pub").read_bytes())


def test_an_unsigned_release_is_refused(release_dir: Path, keys: tuple[Path, bytes]) -> None:
    (release_dir / SIGNATURE).unlink()
    with pytest.raises(UntrustedRelease, match=r"is\ not\ signed:\ SHA256SUMS\.sig\ is\ missing"):
        verify_release(release_dir, keys[1])


def test_a_signature_that_is_not_base64_is_refused(release_dir: Path, keys: tuple[Path, bytes]) -> None:
    (release_dir / SIGNATURE).write_text("not base64!\n")
    with pytest.raises(UntrustedRelease, match="not base64"):
        verify_release(release_dir, keys[1])


def test_addresses() -> None:
    check_release_address("https://releases.example.com/llmgw/1.2.3/")
    check_release_address("http://127.0.0.1:8080/release")
    check_release_address("http://[::1]:8080/release")
    check_release_address("http://localhost/release")
    for refused in (
        "http://releases.example.com/1.2.3",
        "http://10.0.0.5/r",
        "ftp://host/r",
        "file:///tmp/r",
    ):
        with pytest.raises(ConfigError, match="only https"):
            check_release_address(refused)


@pytest.fixture
async def served(release_dir: Path) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_static("/r", release_dir)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}/r"
    await runner.cleanup()


async def test_fetch_over_loopback_http_verifies(
    served: str, keys: tuple[Path, bytes], tmp_path: Path
) -> None:
    release = await fetch_release(served, tmp_path / "fetched", keys[1])
    assert release.version == "1.2.3"
    assert release.wheel.read_bytes() == b"PK\x03\x04 a wheel's bytes"


async def test_fetch_of_a_tampered_release_leaves_nothing(
    served: str, release_dir: Path, keys: tuple[Path, bytes], tmp_path: Path
) -> None:
    (release_dir / "llmgw-1.2.3-py3-none-any.whl").write_bytes(b"PK\x03\x04 other bytes")
    with pytest.raises(UntrustedRelease, match="was altered"):
        await fetch_release(served, tmp_path / "fetched", keys[1])
    assert list((tmp_path / "fetched").iterdir()) == []


async def test_fetch_with_a_bad_signature_never_downloads_the_wheel(
    served: str, release_dir: Path, tmp_path: Path
) -> None:
    generate_signing_key(tmp_path / "other.key", tmp_path / "other.pub")
    with pytest.raises(UntrustedRelease, match="does not trust"):
        await fetch_release(served, tmp_path / "fetched", (tmp_path / "other.pub").read_bytes())
    assert not (tmp_path / "fetched" / "llmgw-1.2.3-py3-none-any.whl").exists()


async def test_fetch_refuses_plain_http_elsewhere(keys: tuple[Path, bytes], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="only https"):
        await fetch_release("http://releases.example.com/1.2.3", tmp_path / "fetched", keys[1])
    assert not (tmp_path / "fetched").exists()


def test_signature_file_is_base64_of_64_bytes(release_dir: Path) -> None:
    assert len(base64.b64decode((release_dir / SIGNATURE).read_text().strip())) == 64
