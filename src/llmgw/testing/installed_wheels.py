"""Wheels made again from the distributions installed in this Python, for installs with no index.

The runtime-dependency test installs llmgw's wheel without extras into a
fresh virtualenv. It needs no network: :func:`wheelhouse` packs the
distributions llmgw's ``dependencies`` need (followed through their own
requirements, markers and extras evaluated here) back into wheels, from the
files each one's ``RECORD`` lists, into a folder the installer is pointed at
with no index. Only that closure goes in, so the dev extras are nowhere the
install could find them: a module the server imports from a dev-only package
fails to import there, as it would on a machine that installed llmgw alone.

Wheels already in the folder (same name, version and tags) are kept, so a
cached wheelhouse costs only the look-up. Byte code is left out (the
installer's Python writes its own), and console scripts too (installers make
them from ``entry_points.txt``); other files under the prefix's ``bin`` (uv's
binary) go back under ``.data/scripts``.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import sys
import zipfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from llmgw.errors import LlmgwError

LEFT_OUT = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}
"""Files of an installed ``.dist-info`` that record the install, not the distribution."""


def closure(requirements: Iterable[str]) -> list[metadata.Distribution]:
    """The installed distributions ``requirements`` need, theirs included, sorted by name.

    A requirement whose marker is false here is left out; a missing distribution raises
    :class:`LlmgwError` naming it."""
    found: dict[str, metadata.Distribution] = {}
    wanted: list[tuple[Requirement, frozenset[str]]] = [
        (Requirement(r), frozenset({""})) for r in requirements
    ]
    extras_seen: dict[str, set[str]] = {}
    while wanted:
        requirement, asked_in = wanted.pop()
        if requirement.marker is not None and not any(
            requirement.marker.evaluate({"extra": extra}) for extra in asked_in
        ):
            continue
        name = canonicalize_name(requirement.name)
        extras = {""} | {canonicalize_name(e) for e in requirement.extras}
        if name in found and extras <= extras_seen[name]:
            continue
        try:
            dist = found.get(name) or metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise LlmgwError(
                f"{requirement.name} is not installed in {sys.prefix}",
                hint="run 'make install' (pip install -e '.[dev]') so the wheelhouse can be made from it",
            ) from None
        found[name] = dist
        extras_seen[name] = extras_seen.get(name, set()) | extras
        wanted += [(Requirement(r), frozenset(extras_seen[name])) for r in dist.requires or ()]
    return [found[name] for name in sorted(found)]


def wheel_name(dist: metadata.Distribution) -> str:
    """``name-version-py-abi-platform.whl`` as the distribution was installed (its WHEEL's tags)."""
    tags = [
        line.split(":", 1)[1].strip().split("-")
        for line in (dist.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag:")
    ] or [["py3", "none", "any"]]
    python, abi, platform = (".".join(sorted({tag[i] for tag in tags})) for i in range(3))
    return f"{_stem(dist)}-{python}-{abi}-{platform}.whl"


def pack(dist: metadata.Distribution, folder: Path) -> Path:
    """Write ``dist`` back as a wheel in ``folder`` (kept if already there); its path."""
    path = folder / wheel_name(dist)
    if path.exists():
        return path
    info = f"{_stem(dist)}.dist-info"
    scripts = {ep.name for ep in dist.entry_points if ep.group in ("console_scripts", "gui_scripts")}
    site = Path(str(dist.locate_file("")))
    prefix = Path(sys.prefix).resolve()
    record: list[tuple[str, str, str]] = []
    partial = path.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as wheel:
        for file in dist.files or ():
            name = str(file)
            if "__pycache__" in file.parts or name.endswith(".pyc"):
                continue
            if file.parts[0].endswith(".dist-info"):
                if file.name in LEFT_OUT:
                    continue
                name = "/".join((info, *file.parts[1:]))
            elif file.parts[0] == "..":
                outside = (site / file).resolve()
                if not outside.is_relative_to(prefix):
                    continue
                relative = outside.relative_to(prefix)
                if relative.parts[0] == "bin":
                    if relative.name in scripts:
                        continue
                    name = f"{_stem(dist)}.data/scripts/{relative.name}"
                else:
                    name = f"{_stem(dist)}.data/data/{relative.as_posix()}"
            source = site / file
            if not source.is_file():
                continue
            data = source.read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            wheel.writestr(_entry(name, source), data)
            record.append((name, f"sha256={digest}", str(len(data))))
        listing = io.StringIO()
        csv.writer(listing, lineterminator="\n").writerows([*record, (f"{info}/RECORD", "", "")])
        wheel.writestr(f"{info}/RECORD", listing.getvalue())
    partial.replace(path)
    return path


def wheelhouse(requirements: Iterable[str], folder: Path) -> list[Path]:
    """Wheels of every installed distribution ``requirements`` need, in ``folder``; their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    return [pack(dist, folder) for dist in closure(requirements)]


def _stem(dist: metadata.Distribution) -> str:
    """``name-version`` as wheel file names write them (runs of ``-_.`` in the name as one ``_``)."""
    return f"{re.sub(r'[-_.]+', '_', dist.metadata['Name'])}-{dist.version.replace('-', '_')}"


def _entry(name: str, source: Path) -> zipfile.ZipInfo:
    """A stored entry keeping the file's mode (uv's binary stays executable)."""
    entry = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    entry.external_attr = (source.stat().st_mode & 0o777 | 0o100000) << 16
    return entry
