"""llmgw's signed releases: a wheel, its SHA256SUMS and the signature of those sums.

A release is a directory (or an https address serving the same files)::

    llmgw-<version>-py3-none-any.whl
    SHA256SUMS          sha256sum's format: "<hex>  <file>", one line per file
    SHA256SUMS.sig      the raw ed25519 signature of SHA256SUMS, base64 on one line

Checking goes signature first (against the key this machine trusts,
``release.trusted_pub``), then every listed file's sha256; a release that
fails either is refused whole, naming the file and what to do.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import ipaddress
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import aiohttp

from llmgw.configfiles import Section
from llmgw.errors import ConfigError, DownloadError, UntrustedRelease
from llmgw.mirror.blobs import CHUNK_SIZE
from llmgw.pki.signing import sign, verify
from llmgw.runtime.files import write_public

SUMS = "SHA256SUMS"
SIGNATURE = "SHA256SUMS.sig"
WHEEL = re.compile(r"^llmgw-(?P<version>[0-9][^-]*)-py3-none-any\.whl$")
"""The name of llmgw's wheel in a release; its version is the release's."""
SMALL_FILE_MAX = 1 << 20
"""Largest SHA256SUMS or signature fetched: anything bigger is not one."""
_SUM_LINE = re.compile(r"^(?P<sha>[0-9a-fA-F]{64}) [ *](?P<name>.+)$")
FETCH_HINT = "fetch the release again from its source, or make it again with 'make release KEY=...'"


class ReleaseSettings(Section):
    trusted_pub: str = "trusted.pub"
    """The release key's public half (PEM) that releases and bundles must be signed by (relative: to
    the config's directory). Made by ``llmgw release keygen``; only the node's own file sets it."""


@dataclass(frozen=True)
class Release:
    version: str
    wheel: Path
    sha256: str
    """The wheel's sha256."""


def read_trusted_key(path: Path) -> bytes:
    """The trusted public key's PEM bytes at ``path``; ConfigError saying how to provide it."""
    try:
        return path.read_bytes()
    except OSError as error:
        raise ConfigError(
            f"cannot read the trusted release key {path}: {error.strerror or error}",
            hint="copy the release key's public half (from 'llmgw release keygen') there, or set "
            "release.trusted_pub to where it is",
        ) from error


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK_SIZE):
            digest.update(chunk)
    return digest.hexdigest()


def format_sums(sums: dict[str, str]) -> bytes:
    """``sums`` (file name to sha256) in sha256sum's format, sorted by name."""
    return "".join(f"{sha}  {name}\n" for name, sha in sorted(sums.items())).encode()


def parse_sums(text: bytes, where: str = SUMS) -> dict[str, str]:
    """File name to sha256 from sha256sum's format; UntrustedRelease on any line that is not one."""
    sums: dict[str, str] = {}
    try:
        lines = text.decode().splitlines()
    except UnicodeDecodeError as error:
        raise UntrustedRelease(f"{where} is not text", hint=FETCH_HINT) from error
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        match = _SUM_LINE.match(line)
        name = match.group("name") if match else ""
        if match is None or not _plain_name(name):
            raise UntrustedRelease(
                f"{where} line {number} is not '<sha256>  <file>': {line[:80]!r}", FETCH_HINT
            )
        if name in sums:
            raise UntrustedRelease(f"{where} lists {name} twice", hint=FETCH_HINT)
        sums[name] = match.group("sha").lower()
    return sums


def _plain_name(name: str) -> bool:
    """A file name in a release: relative, no parent steps (paths under the release are allowed)."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def read_signature(directory: Path) -> bytes:
    """The raw signature in ``directory/SHA256SUMS.sig``; UntrustedRelease when missing or unreadable."""
    path = directory / SIGNATURE
    if not path.is_file():
        raise UntrustedRelease(
            f"{directory} is not signed: {SIGNATURE} is missing",
            hint="use a release made with 'make release KEY=...' (it writes SHA256SUMS.sig); "
            "unsigned releases are never installed",
        )
    try:
        return base64.b64decode(path.read_bytes().strip(), validate=True)
    except (binascii.Error, ValueError) as error:
        raise UntrustedRelease(f"{path} is not base64 on one line", hint=FETCH_HINT) from error


def verify_signed_sums(directory: Path, trusted_public_key: bytes) -> dict[str, str]:
    """``directory``'s SHA256SUMS once its signature is the trusted key's (files not checked yet)."""
    signature = read_signature(directory)
    sums_path = directory / SUMS
    if not sums_path.is_file():
        raise UntrustedRelease(f"{directory} has no {SUMS}", hint=FETCH_HINT)
    data = sums_path.read_bytes()
    try:
        verify(data, signature, trusted_public_key)
    except UntrustedRelease as error:
        raise UntrustedRelease(f"{sums_path}: {error.message}", error.hint) from error
    return parse_sums(data, str(sums_path))


def verify_files(directory: Path, sums: dict[str, str]) -> None:
    """Each listed file is in ``directory`` with its sha256; UntrustedRelease naming one that is not."""
    for name, expected in sorted(sums.items()):
        path = directory / name
        if not path.is_file():
            raise UntrustedRelease(f"{path} is missing (SHA256SUMS lists it)", hint=FETCH_HINT)
        actual = file_sha256(path)
        if actual != expected:
            raise UntrustedRelease(
                f"{path} was altered: its sha256 is {actual}, SHA256SUMS says {expected}",
                hint=FETCH_HINT,
            )


def verify_release(directory: Path, trusted_public_key: bytes) -> Release:
    """The release in ``directory``, once its signature and every file's sha256 are right."""
    sums = verify_signed_sums(directory, trusted_public_key)
    wheels = [name for name in sums if WHEEL.match(name)]
    if len(wheels) != 1:
        raise UntrustedRelease(
            f"{directory / SUMS} lists {len(wheels)} llmgw wheels, not one",
            hint="a release holds exactly one llmgw-<version>-py3-none-any.whl; make it with 'make release'",
        )
    verify_files(directory, sums)
    match = WHEEL.match(wheels[0])
    assert match is not None
    return Release(version=match.group("version"), wheel=directory / wheels[0], sha256=sums[wheels[0]])


def write_release(directory: Path, wheel: Path, private_key_path: Path) -> Release:
    """Write a signed release of ``wheel`` in ``directory``: the wheel, its sums and their signature."""
    if not WHEEL.match(wheel.name):
        raise ConfigError(
            f"{wheel.name} is not llmgw's wheel (llmgw-<version>-py3-none-any.whl)",
            hint="build it with 'python -m pip wheel --no-deps .'",
        )
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("llmgw-*.whl"):
        if old.name != wheel.name:
            old.unlink()
    target = directory / wheel.name
    if wheel.resolve() != target.resolve():
        shutil.copyfile(wheel, target)
    sha = file_sha256(target)
    sums = format_sums({wheel.name: sha})
    signature = sign(sums, private_key_path)
    write_public(directory / SUMS, sums)
    write_public(directory / SIGNATURE, base64.b64encode(signature) + b"\n")
    match = WHEEL.match(wheel.name)
    assert match is not None
    return Release(version=match.group("version"), wheel=target, sha256=sha)


def check_release_address(url: str) -> None:
    """Return if releases may be fetched from ``url``: https, or http to this machine only."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname and _loopback(parts.hostname):
        return
    raise ConfigError(
        f"refusing to fetch a release from {url!r}: only https addresses (or http to this machine) are used",
        hint="serve the release over https, or copy its directory here and give the directory",
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def fetch_release(
    url: str,
    into: Path,
    trusted_public_key: bytes,
    *,
    session: aiohttp.ClientSession | None = None,
) -> Release:
    """Download the release at ``url`` into ``into`` and verify it; nothing unverified is left there."""
    check_release_address(url)
    base = url.rstrip("/") + "/"
    owned = session is None
    http = session or aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=60))
    written: list[Path] = []
    try:
        for name in (SUMS, SIGNATURE):
            written.append(await download(http, base + name, into / name, SMALL_FILE_MAX))
        sums = await asyncio.to_thread(verify_signed_sums, into, trusted_public_key)
        for name in sorted(set(sums) - {SUMS, SIGNATURE}):
            written.append(await download(http, base + name, into / name, None))
        return await asyncio.to_thread(verify_release, into, trusted_public_key)
    except BaseException:
        _discard(written)
        raise
    finally:
        if owned:
            await http.close()


async def download(http: aiohttp.ClientSession, url: str, dest: Path, limit: int | None) -> Path:
    """Fetch ``url`` into ``dest`` (at most ``limit`` bytes); nothing is left at ``dest`` on failure."""
    stream = await asyncio.to_thread(_open_for_writing, dest)
    size = 0
    try:
        with stream:
            async with http.get(url) as response:
                if response.status != 200:
                    raise DownloadError(
                        f"{url} answered {response.status}",
                        hint="check the address: a release serves SHA256SUMS, SHA256SUMS.sig and its files",
                    )
                async for chunk in response.content.iter_chunked(CHUNK_SIZE):
                    size += len(chunk)
                    if limit is not None and size > limit:
                        raise UntrustedRelease(f"{url} is larger than {limit} bytes", hint=FETCH_HINT)
                    stream.write(chunk)
    except aiohttp.ClientError as error:
        _discard([dest])
        raise DownloadError(
            f"cannot fetch {url}: {error}", hint="check the address and the network"
        ) from error
    except BaseException:
        _discard([dest])
        raise
    return dest


def _open_for_writing(dest: Path) -> BinaryIO:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest.open("wb")


def _discard(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
