"""Installing a ComfyUI build: the archive checked and unpacked beside a virtualenv made with uv.

``engines/comfyui/<version>-<digest>-<torch>/`` under the cache holds
``src/`` (the release, its top folder stripped), ``venv/`` and, written last,
``build.json`` (a folder without one is not an install). The steps:

1. the archive is downloaded (https, or a ``file://`` path on the node) and its
   sha256 compared with the recipe's; a mismatch leaves nothing behind;
2. ``requirements.txt`` is checked: PyPI packages only;
3. ``uv venv``; torch from the index its build names (no torch: a node that
   brings its own, and the tests); then ``uv pip install --exclude-newer
   <release + 1 day> -r requirements.txt``, torch being already there;
4. with torch, the card check (:func:`~llmgw.engines.comfyui_builds.card_check_command`).

The build's ``python`` and ``main`` are what agent.yaml's ``engines.comfyui.python``
and ``engines.comfyui.main`` otherwise name.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

import aiohttp

from llmgw.engines.comfyui_builds import (
    Recipe,
    TorchBuild,
    card_check_command,
    check_requirements,
    choose_installed,
)
from llmgw.engines.pythonbuilds import _run
from llmgw.engines.sourcebuild import Progress
from llmgw.errors import BuildError

CHUNK = 1 << 20
INSTALL_TIMEOUT_S = 3600.0
CHECK_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class InstalledComfyUI:
    """A ComfyUI build ready to start: the two paths agent.yaml's ``engines.comfyui`` names."""

    python: Path
    main: Path
    version: str
    torch: str
    """The torch variant (``cu130``, ``cu129``, ``cu126``); empty: none installed by llmgw."""


def uv_binary() -> str:
    """uv, as the ``uv`` package installs it beside llmgw."""
    from uv import find_uv_bin

    return str(find_uv_bin())


def comfyui_dir(cache_dir: Path, recipe: Recipe, torch: TorchBuild | None) -> Path:
    return Path(cache_dir) / "engines" / "comfyui" / f"{recipe.key}-{torch.variant if torch else 'notorch'}"


def installed_comfyui(cache_dir: Path, recipe: Recipe, torch: TorchBuild | None) -> InstalledComfyUI | None:
    """The build installed for ``recipe`` and ``torch``; None when there is no whole install."""
    folder = comfyui_dir(cache_dir, recipe, torch)
    try:
        record = json.loads((folder / "build.json").read_text())
    except (OSError, ValueError):
        return None
    found = InstalledComfyUI(Path(record["python"]), Path(record["main"]), recipe.version, record["torch"])
    return found if found.python.exists() and found.main.exists() else None


def torch_command(uv: str, python: Path, torch: TorchBuild) -> list[str]:
    """uv's command installing ``torch``'s build into the environment of ``python``."""
    return [uv, "pip", "install", "--python", str(python), *torch.install_arguments()]


def requirements_command(uv: str, python: Path, recipe: Recipe, requirements: Path) -> list[str]:
    """uv's command installing ComfyUI's requirements as PyPI stood the day after the release."""
    return [uv, "pip", "install", "--python", str(python), "--exclude-newer", recipe.exclude_newer,
            "-r", str(requirements)]  # fmt: skip


async def install_comfyui(
    recipe: Recipe,
    cache_dir: Path,
    torch: TorchBuild | None,
    *,
    progress: Progress | None = None,
    session: aiohttp.ClientSession | None = None,
    python: str = sys.executable,
) -> InstalledComfyUI:
    """Install ``recipe`` with ``torch`` (None: no torch, no card check); BuildError, leaving nothing."""
    say: Progress = progress or (lambda message, fraction: None)
    if found := installed_comfyui(cache_dir, recipe, torch):
        return found
    folder = comfyui_dir(cache_dir, recipe, torch)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        archive = folder / "source.tar.gz"
        say(f"downloading ComfyUI {recipe.version} from {recipe.archive_url}", None)
        digest = await _download(recipe.archive_url, archive, session)
        if digest != recipe.sha256:
            raise BuildError(
                f"ComfyUI {recipe.version}'s archive from {recipe.archive_url} has sha256 {digest}, "
                f"not the recipe's {recipe.sha256}",
                hint="the archive changed or the recipe is wrong: check the digest, never skip it",
            )
        source = folder / "src"
        await asyncio.to_thread(_unpack, archive, source)
        archive.unlink()
        requirements = source / "requirements.txt"
        if not requirements.is_file() or not (source / "main.py").is_file():
            raise BuildError(
                f"{recipe.archive_url} holds no ComfyUI release (no main.py and requirements.txt at its top)",
                hint="name ComfyUI's source archive of a release in the recipe",
            )
        check_requirements(requirements.read_text(), f"ComfyUI {recipe.version}'s requirements.txt")
        uv = uv_binary()
        venv = folder / "venv"
        venv_python = venv / "bin" / "python"
        await _step(say, "creating the virtualenv", [uv, "venv", "--python", python, str(venv)], 300)
        if torch is not None:
            await _step(say, f"installing torch ({torch.variant})", torch_command(uv, venv_python, torch))
        await _step(
            say, "installing requirements", requirements_command(uv, venv_python, recipe, requirements)
        )
        if torch is not None:
            say("checking torch on the card", None)
            code, text = await _run(card_check_command(venv_python), CHECK_TIMEOUT_S)
            if code != 0:
                raise BuildError(
                    f"ComfyUI {recipe.version} with torch {torch.variant} installed but fails on the card: "
                    f"{text}",
                    hint="the build does not fit this node's driver or cards; the next one is tried",
                )
        record = {
            "version": recipe.version, "sha256": recipe.sha256, "torch": torch.variant if torch else "",
            "python": str(venv_python), "main": str(source / "main.py"),
            "installed_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }  # fmt: skip
        (folder / "build.json").write_text(json.dumps(record, indent=2) + "\n")
        return InstalledComfyUI(venv_python, source / "main.py", recipe.version, record["torch"])
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, folder, True)
        raise


async def _step(say: Progress, what: str, argv: list[str], timeout_s: float = INSTALL_TIMEOUT_S) -> None:
    say(what, None)
    code, text = await _run(argv, timeout_s)
    if code != 0:
        raise BuildError(
            f"{what} failed (exit {code}): {text}", hint="check the network to PyPI and the disk"
        )


async def _download(url: str, path: Path, session: aiohttp.ClientSession | None) -> str:
    """Write ``url`` to ``path``; its sha256."""
    digest = hashlib.sha256()
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return await asyncio.to_thread(_copy, Path(unquote(parsed.path)), path)
    own = session is None
    client = session or aiohttp.ClientSession()
    try:
        async with client.get(url) as answer:
            if answer.status != 200:
                raise BuildError(f"{url} answered {answer.status}", hint="check the recipe's version and url")
            with path.open("wb") as out:
                async for chunk in answer.content.iter_chunked(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
    except aiohttp.ClientError as error:
        raise BuildError(f"cannot download {url}: {error}", hint="check the node's network") from None
    finally:
        if own:
            await client.close()
    return digest.hexdigest()


def _copy(local: Path, path: Path) -> str:
    """Copy the archive at ``local`` to ``path``; its sha256."""
    if not local.is_file():
        raise BuildError(f"no archive at {local}", hint="name an existing file in the recipe's url")
    shutil.copyfile(local, path)
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _unpack(archive: Path, target: Path) -> None:
    """Unpack ``archive`` into ``target``, its one top folder stripped (GitHub's ``ComfyUI-<v>/``)."""
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        tops = {m.name.split("/", 1)[0] for m in members}
        strip = len(tops) == 1 and any("/" in m.name for m in members)
        kept = []
        for member in members:
            name = member.name.split("/", 1)[1] if strip and "/" in member.name else member.name
            if strip and "/" not in member.name:
                continue
            kept.append(member.replace(name=name))
        tar.extractall(target, members=kept, filter="data")


async def comfyui_for_node(
    recipe: Recipe,
    cache_dir: Path,
    wanted: Sequence[TorchBuild],
    *,
    progress: Progress | None = None,
) -> InstalledComfyUI:
    """The node's ComfyUI: the first of ``wanted`` (:func:`~llmgw.engines.comfyui_builds.torch_builds`,
    best first) already installed, else the first that installs and passes the card check."""
    if not wanted:
        raise BuildError(
            "no torch build for ComfyUI fits this node's driver and cards",
            hint="ComfyUI's torch needs driver 525 or newer and a card of compute capability 6.0 or more; "
            "or name an installed ComfyUI in agent.yaml (engines.comfyui.python and .main)",
        )
    kept = choose_installed(wanted, [b.variant for b in wanted if installed_comfyui(cache_dir, recipe, b)])
    if kept is not None:
        found = installed_comfyui(cache_dir, recipe, kept)
        assert found is not None
        return found
    failures = []
    for torch in wanted:
        try:
            return await install_comfyui(recipe, cache_dir, torch, progress=progress)
        except (BuildError, OSError) as error:
            failures.append(f"{torch.variant}: {error}")
    raise BuildError(
        f"no ComfyUI {recipe.version} build could be installed; tried " + "; ".join(failures),
        hint="fix the first reason above, or name an installed ComfyUI in agent.yaml (engines.comfyui)",
    )
