"""The training environment: a virtualenv of its own with torch, transformers and peft, cached.

It lives in the cache like the engines' builds, keyed by its pinned
requirements, so a change of pins makes a new one and never alters one a
trainer may be using::

    training/<key>/venv/            the environment (its python runs the trainer)
    training/<key>/environment.json the requirements, installed_at
    training/.<key>.<random>.partial/   an install under way
    training/.lock                  held while installing (one install at a time per cache)

An install is assembled in a ``.partial`` folder and renamed into place, so a
folder under a key's name is always a whole environment; a crash leaves only a
``.partial`` folder, removed by the next install. pip's progress is reported
line by line (the agent shows it as the job's ``detail``).

torch is pinned to 2.13.0. pip takes the build its index offers: the CPU build
where the index (or ``find-links``) holds it, PyPI's CUDA build of the same
version on a node whose pip points at PyPI. ``python -m llmgw.training.environment``
(``make training``) installs it ahead of any job.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from llmgw.errors import BuildError

REQUIREMENTS = (
    "torch==2.13.0",
    "transformers==4.57.6",
    "peft==0.21.0",
    "accelerate==1.15.0",
    "safetensors==0.8.0",
    "numpy==2.4.6",
    "sentencepiece==0.2.2",
    "gguf==0.19.0",
)
"""What the trainer and llama.cpp's conversion scripts import, pinned."""

INSTALL_TIMEOUT_S = 3600.0
Say = Callable[[str], None]


def environment_key(requirements: Sequence[str] = REQUIREMENTS) -> str:
    """The environment's folder name: a digest of its sorted requirements."""
    return hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:16]


def environment_dir(cache_dir: Path, requirements: Sequence[str] = REQUIREMENTS) -> Path:
    return Path(cache_dir) / "training" / environment_key(requirements)


def installed_python(cache_dir: Path, requirements: Sequence[str] = REQUIREMENTS) -> Path | None:
    """The environment's python when it is installed whole; None otherwise."""
    folder = environment_dir(cache_dir, requirements)
    python = folder / "venv" / "bin" / "python"
    if (folder / "environment.json").is_file() and python.exists():
        return python
    return None


async def install(
    cache_dir: Path,
    *,
    requirements: Sequence[str] = REQUIREMENTS,
    say: Say | None = None,
    pip_arguments: Sequence[str] = (),
) -> Path:
    """The environment's python, installed first when it is not (BuildError, leaving nothing, on failure)."""
    tell: Say = say or (lambda line: None)
    if found := installed_python(cache_dir, requirements):
        return found
    root = Path(cache_dir) / "training"
    async with _locked(root, tell):
        if found := installed_python(cache_dir, requirements):  # installed while we waited
            return found
        for partial in root.glob(".*.partial"):
            shutil.rmtree(partial, ignore_errors=True)
        final = environment_dir(cache_dir, requirements)
        work = root / f".{final.name}.{secrets.token_hex(4)}.partial"
        try:
            venv = work / "venv"
            tell("creating the training environment")
            await _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tell)
            tell(f"installing {', '.join(requirements)}")
            await _run(
                [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                 "--disable-pip-version-check", "--progress-bar", "off", *pip_arguments, *requirements],
                tell,
            )  # fmt: skip
            record = {
                "requirements": list(requirements),
                "installed_at": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            (work / "environment.json").write_text(json.dumps(record, indent=2) + "\n")
            if final.exists():  # a folder left without its record: not an install
                shutil.rmtree(final)
            os.rename(work, final)
            tell("training environment installed")
        finally:
            await asyncio.to_thread(shutil.rmtree, work, True)
    found = installed_python(cache_dir, requirements)
    assert found is not None
    return found


async def _run(args: list[str], tell: Say) -> None:
    """Run ``args``, telling each line of its output; BuildError with the last lines when it fails."""
    try:
        process = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
    except OSError as error:
        raise BuildError(f"cannot run {args[0]}: {error}", hint="check the agent's Python") from error
    assert process.stdout is not None
    last: list[str] = []
    try:
        async with asyncio.timeout(INSTALL_TIMEOUT_S):
            async for raw in process.stdout:
                line = raw.decode(errors="replace").rstrip()
                if line:
                    last = [*last[-9:], line]
                    tell(line)
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if code != 0:
        raise BuildError(
            f"installing the training environment failed ({' '.join(args[2:4])}, exit {code}): "
            + " | ".join(last),
            hint="check the node's package index (pip's configuration) and its disk; the job may be retried",
        )


@contextlib.asynccontextmanager
async def _locked(directory: Path, tell: Say) -> AsyncIterator[None]:
    """Hold the training environments' install lock (one install at a time per cache, across processes)."""
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    lock = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        waited = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    tell("waiting for another install of the training environment")
                    waited = True
                await asyncio.sleep(0.5)
        yield
    finally:
        os.close(lock)


def main() -> None:
    """Install the training environment into ``$LLMGW_CACHE`` (``make training``)."""
    cache = Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw").expanduser()
    python = asyncio.run(install(cache, say=print))
    print(python)


if __name__ == "__main__":
    main()
