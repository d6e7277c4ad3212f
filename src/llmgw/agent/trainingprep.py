"""What a training job runs from on this node: the environment, the base model, llama.cpp's converter.

- The training environment (:mod:`llmgw.training.environment`), installed once
  per cache; pip's lines become the job's ``detail``.
- The base model's files, fetched from the mirror by sha256 like a shard's
  weights (:meth:`llmgw.agent.installing.Installer.blob`) into a folder of their
  own (:func:`llmgw.agent.weightfiles.model_folder`).
- For a GGUF adapter, llama.cpp's ``convert_lora_to_gguf.py`` from the same
  source as the node's llama.cpp build (:mod:`llmgw.engines.convertscripts`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from llmgw.agent import weightfiles
from llmgw.agent.training import TrainerInputs
from llmgw.core.trainingstream import StartTraining
from llmgw.engines import builds, convertscripts
from llmgw.training import environment, trainer

Blob = Callable[[str, str, str, int], Awaitable[Path]]
"""A mirrored file fetched once: ``(model, sha256, filename, size)`` to its path (Installer.blob)."""


class TrainingPreparer:
    """Prepares a job's inputs; one install of each thing at a time."""

    def __init__(
        self,
        cache_dir: Path,
        weights_dir: Path,
        blob: Blob,
        llama_server: Callable[[], Awaitable[Path]],
        *,
        pypi_url: str = builds.PYPI_URL,
        pip_arguments: tuple[str, ...] = (),
    ) -> None:
        self._cache = cache_dir
        self._weights = weights_dir
        self._blob = blob
        self._llama_server = llama_server
        self._pypi_url = pypi_url
        self._pip_arguments = pip_arguments
        self._lock = asyncio.Lock()

    async def __call__(self, start: StartTraining, say: Callable[[str], None]) -> TrainerInputs:
        async with self._lock:
            say("installing the training environment")
            python = await environment.install(self._cache, say=say, pip_arguments=self._pip_arguments)
            convert = await self._converter(say) if start.gguf else None
        fetched = []
        for number, file in enumerate(start.weights, 1):
            say(f"fetching the base model's files: {file.filename} ({number} of {len(start.weights)})")
            path = await self._blob(start.model, file.sha256, file.filename, file.size)
            fetched.append((file.filename, file.sha256, path))
        base = await asyncio.to_thread(weightfiles.model_folder, self._weights, fetched)
        return TrainerInputs(python, Path(trainer.__file__), base, convert)

    async def _converter(self, say: Callable[[str], None]) -> Path:
        say("finding llama.cpp's conversion scripts")
        build_folder = (await self._llama_server()).parent
        pin = convertscripts.source_of(build_folder, builds.LLAMACPP_SOURCE)
        folder = await convertscripts.ensure_scripts(
            build_folder,
            pin,
            pypi_url=self._pypi_url,
            downloads=self._cache / "downloads",
            progress=lambda message, fraction: say(message),
        )
        return folder / "convert_lora_to_gguf.py"
