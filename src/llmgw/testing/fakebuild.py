"""Builds and releases small enough for tests: a llama.cpp archive whose ``llama-server`` prints its
version, and a wheel named like llmgw's."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

SCRIPT = b"#!/bin/sh\necho 'version: 1 (fake build)'\n"


def fake_llamacpp_archive() -> bytes:
    """A .tar.gz laid out like llama.cpp's release assets (``build/bin/llama-server``)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("build/bin/llama-server")
        info.size, info.mode = len(SCRIPT), 0o755
        tar.addfile(info, io.BytesIO(SCRIPT))
    return buffer.getvalue()


def fake_llmgw_wheel(directory: Path, version: str) -> Path:
    """A wheel named like llmgw's, of ``version``, holding one module and needing nothing: pip installs
    it offline into a scratch environment, so an upgrade can be run for real without touching llmgw."""
    name = f"llmgw-{version}-py3-none-any.whl"
    info = f"llmgw-{version}.dist-info"
    files = {
        "llmgw_release_probe.py": f"VERSION = {version!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: llmgw\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: llmgw-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in files.items()]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / name
    with zipfile.ZipFile(path, "w") as wheel:
        for member, data in files.items():
            wheel.writestr(member, data)
    return path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def relabel_wheel(wheel: Path, version: str, into: Path) -> Path:
    """A copy of llmgw's ``wheel`` claiming ``version`` (its metadata and ``llmgw.__version__``), its
    RECORD made again: a next release of the same code, for an upgrade run for real."""
    old = wheel.name.split("-")[1]
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as source:
        for member in source.namelist():
            data = source.read(member)
            name = member.replace(f"llmgw-{old}.dist-info/", f"llmgw-{version}.dist-info/")
            if name.endswith(".dist-info/METADATA"):
                data = data.replace(f"\nVersion: {old}\n".encode(), f"\nVersion: {version}\n".encode(), 1)
            if name == "llmgw/__init__.py":
                data = data.replace(f'__version__ = "{old}"'.encode(), f'__version__ = "{version}"'.encode())
            files[name] = data
    record = f"llmgw-{version}.dist-info/RECORD"
    lines = [f"{name},sha256={_digest(data)},{len(data)}" for name, data in files.items() if name != record]
    files[record] = ("\n".join([*lines, f"{record},,"]) + "\n").encode()
    path = into / f"llmgw-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as target:
        for name, data in files.items():
            target.writestr(name, data)
    return path


def fake_engine_wheel(directory: Path, engine: str, version: str) -> Path:
    """A pure wheel named like an engine's (``vllm``), of ``version``, whose console script of the
    engine's name prints the version: pip installs it offline, and the install's check runs it."""
    name = f"{engine}-{version}-py3-none-any.whl"
    info = f"{engine}-{version}.dist-info"
    files = {
        f"{engine}/__init__.py": f"def main():\n    print({version!r})\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {engine}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: llmgw-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[console_scripts]\n{engine} = {engine}:main\n".encode(),
    }
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in files.items()]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / name
    with zipfile.ZipFile(path, "w") as wheel:
        for member, data in files.items():
            wheel.writestr(member, data)
    return path
