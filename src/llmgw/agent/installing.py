"""What a shard needs on disk before its engine starts: the engine build, the weights, the adapters.

An engine build is accepted only once it computes on this node (C4.2): each
install passes the node's check (:class:`~llmgw.engines.checking.LlamaCppBuildCheck`,
:mod:`~llmgw.engines.pythonchecks`) with the node's driver and cards
(:class:`~llmgw.engines.buildverdicts.NodeConditions`), and a build refused
here is not tried again while they stay the same.

Weights are fetched once per sha256 and reused only when they still hash to
it; a model of several files gets a folder of its own, named by its files'
digests (:mod:`llmgw.agent.weightfiles`). With tracing on, the engine's install
and each file's fetch are spans of the shard's start (:mod:`llmgw.agent.starttracing`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from llmgw.agent import metrics, weightfiles
from llmgw.agent.config import AgentConfig, ComfyuiRecipeSettings
from llmgw.agent.fetchprogress import FetchMeters, shard_files
from llmgw.agent.mirrorbuilds import MirrorBuildSource
from llmgw.agent.starttracing import ShardStartTraces
from llmgw.core.devices import NodeInventory
from llmgw.core.engines import ENGINE_NAMES, Provisioning, find_engine
from llmgw.core.shards import AdapterSpec, ShardSpec, WeightsFile
from llmgw.engines import builds, checking, comfyui, comfyui_builds, comfyui_install, pythonbuilds, trtllm
from llmgw.engines.buildverdicts import NodeConditions, refusal
from llmgw.engines.engine import LaunchAdapter
from llmgw.errors import ChannelClosed, ChecksumMismatch, DownloadError, LlmgwError
from llmgw.mirror.fetching import BlobWriter, read_ahead

log = logging.getLogger(__name__)

FETCH_ATTEMPTS = 3

T = TypeVar("T")

BlobFetcher = Callable[[str, int], AsyncIterator[bytes]]


@dataclass(frozen=True)
class Prepared:
    """What a shard's engine is started from."""

    program: Path
    """The engine's executable (llama-server, vllm) or the Python that runs it (SGLang, TensorRT-LLM)."""
    weights: Path
    """The GGUF file, or the folder holding a safetensors repository."""
    projector: Path | None = None
    adapters: tuple[LaunchAdapter, ...] = ()
    """Every LoRA adapter of the model on this node (a PEFT folder or a GGUF file)."""
    entry: Path | None = None
    """The script ``program`` runs (ComfyUI's main.py); None for the other engines."""


class Installer:
    """Engine builds (cached across the node) and weights (per sha256), each fetched once."""

    def __init__(
        self,
        config: AgentConfig,
        inventory: Callable[[], NodeInventory],
        fetch: Callable[[], BlobFetcher],
        traces: ShardStartTraces | None = None,
        meters: FetchMeters | None = None,
    ) -> None:
        self._config = config
        self.meters = meters or FetchMeters(lambda replica_id, progress: None)
        self._traces = traces or ShardStartTraces()
        self._inventory = inventory
        self._fetch = fetch
        self._engine_lock = asyncio.Lock()
        self._weights_locks: dict[str, asyncio.Lock] = {}
        self._installed: builds.InstalledBuild | None = None
        self._python_locks: dict[str, asyncio.Lock] = {}
        self._python_installed: dict[str, Path] = {}
        self.mirror = MirrorBuildSource(fetch)
        """The engine builds of the control plane's mirror, tried before the public release."""

    def node(self) -> NodeConditions:
        """What the verdicts on this node's builds depend on: its driver and cards, as discovered."""
        inventory = self._inventory()
        return NodeConditions.of(inventory.driver_version, (gpu.name for gpu in inventory.gpus))

    def installed_engines(self) -> list[str]:
        """Engine builds on this node, those refused here left out: ``llama.cpp <version> <variant>``,
        ``vllm <version> <variant>``."""
        cache, node = self._config.cache_path, self.node()
        present: list[builds.Build | pythonbuilds.PythonBuild] = [b.build for b in builds.installed(cache)]
        present += [b.build for b in pythonbuilds.installed_python_builds(cache)]
        return [
            f"{b.engine} {b.version} {b.variant}"
            for b in present
            if not ((refused := refusal(cache, b.engine, b.key)) and refused.holds(node))
        ]

    async def engine(self) -> Path:
        given = self._config.engines.llamacpp.binary
        if given:
            return _operator_binary(self._config.path(given))
        async with self._engine_lock:
            if self._installed is None:
                inventory = self._inventory()
                candidates = builds.llamacpp_builds(
                    has_nvidia=bool(inventory.gpus),
                    driver_version=inventory.driver_version or None,
                    arch=platform.machine(),
                    tag=self._config.engines.llamacpp.release_tag,
                )
                self._installed = await builds.install_best(
                    candidates,
                    self._config.cache_path,
                    check=checking.LlamaCppBuildCheck(self.node()),
                    progress=_log_progress,
                    release_api=self._config.engines.llamacpp.release_api,
                    pypi_url=self._config.engines.llamacpp.pypi_url,
                    mirror=self.mirror,
                )
                metrics.BUILDS_INSTALLED.labels(builds.LLAMACPP).inc()
                log.info(
                    "engine build: %s %s %s at %s",
                    self._installed.build.engine,
                    self._installed.build.version,
                    self._installed.build.variant,
                    self._installed.binary,
                )
            return self._installed.binary

    async def program(self, engine: str) -> Path:
        """The executable a shard of ``engine`` starts from, installing the engine where llmgw does."""
        if engine in ("", builds.LLAMACPP):
            return await self.engine()
        if engine == trtllm.NAME:
            python = self._config.engines.trtllm.python
            if not python:
                raise LlmgwError(
                    "engine trtllm is not available on this node: engines.trtllm.python is not set",
                    "install TensorRT-LLM and set engines.trtllm.python in agent.yaml to its Python",
                )
            serve = trtllm.serve_program(Path(python))
            if not await asyncio.to_thread(serve.exists):
                raise LlmgwError(
                    f"there is no trtllm-serve beside {python}",
                    "set engines.trtllm.python to the Python of the environment TensorRT-LLM is installed in",
                )
            return Path(python)
        if engine == comfyui.NAME:
            return (await self.comfyui())[0]
        caps = find_engine(engine)
        if caps is None or caps.provisioning is not Provisioning.PYTHON_WHEELS:
            raise LlmgwError(
                f"engine {engine!r} is not available on this node", f"use one of {', '.join(ENGINE_NAMES)}"
            )
        settings = getattr(self._config.engines, engine)
        if settings.program:
            program = self._config.path(settings.program)
            if not await asyncio.to_thread(program.exists):
                raise LlmgwError(
                    f"engines.{engine}.program names {program}, which does not exist",
                    f"install {engine} there, or clear the setting to let the node install it",
                )
            return program
        lock = self._python_locks.setdefault(engine, asyncio.Lock())
        async with lock:
            if engine not in self._python_installed:
                inventory = self._inventory()
                capabilities = [pythonbuilds.compute_capability(gpu.name) for gpu in inventory.gpus]
                listing = pythonbuilds.LISTINGS[engine]
                candidates = listing(
                    driver_version=inventory.driver_version or None,
                    capabilities=capabilities,
                    version=settings.version,
                )
                node = self.node()
                found = await self._from_wheelhouse(candidates, node) or await pythonbuilds.install_first(
                    candidates,
                    self._config.cache_path,
                    node=node,
                    index_url=settings.index_url,
                    progress=_log_progress,
                    torch_index=settings.torch_index_url,
                )
                log.info("engine build: %s %s at %s", engine, found.build.key, found.program)
                metrics.BUILDS_INSTALLED.labels(engine).inc()
                self._python_installed[engine] = found.program
            return self._python_installed[engine]

    async def _from_wheelhouse(
        self, candidates: list[pythonbuilds.PythonBuild], node: NodeConditions
    ) -> pythonbuilds.InstalledPythonBuild | None:
        """The first candidate accepted here: installed already, or from a wheelhouse the mirror holds
        (no index); a build refused here is passed over. None when the mirror holds no wheelhouse
        that installs and passes (the index is tried next, as without a mirror)."""
        arch = platform.machine()
        cache = self._config.cache_path
        for build in candidates:
            if found := pythonbuilds.accepted_python_build(cache, build, node):
                return found
            if pythonbuilds.refusal(cache, build, node):
                continue
            installed = pythonbuilds.installed_python_build(cache, build) is not None
            held = (
                None
                if installed
                else self.mirror.find_wheels(build.engine, build.version, build.variant, arch)
            )
            if not installed and held is None:
                continue
            wheelhouse = cache / "downloads" / f"wheelhouse-{build.engine}-{build.key}-{arch}"
            try:
                if held is not None:
                    await self.mirror.fetch(held, wheelhouse)
                return await pythonbuilds.install_python_build(  # an installed one is checked, if need be
                    build, cache, wheelhouse=wheelhouse if held else None, progress=_log_progress, node=node
                )
            except (LlmgwError, OSError) as error:
                log.warning("%s %s was not taken: %s", build.engine, build.key, error)
        return None

    async def comfyui(self) -> tuple[Path, Path]:
        """ComfyUI's Python and main.py: the operator's (``engines.comfyui.python`` and ``.main``), or
        the build of ``engines.comfyui.recipe`` this node installs (torch for its driver and cards)."""
        settings = self._config.engines.comfyui
        if not settings.python and not settings.main and settings.recipe is not None:
            return await self._comfyui_build(settings.recipe)
        if not settings.python or not settings.main:
            raise LlmgwError(
                "engine comfyui is not available on this node: engines.comfyui.python and .main are not set",
                "install ComfyUI and set engines.comfyui.python (its environment's Python) and "
                "engines.comfyui.main (its main.py) in agent.yaml, or name a release for the node to "
                "install in engines.comfyui.recipe",
            )
        python, main = self._config.path(settings.python), self._config.path(settings.main)
        for path, setting in ((python, "python"), (main, "main")):
            if not await asyncio.to_thread(path.is_file):
                raise LlmgwError(
                    f"engines.comfyui.{setting} names {path}, which is not a file",
                    "point it at ComfyUI's installation on this node",
                )
        return python, main

    async def _comfyui_build(self, wanted: ComfyuiRecipeSettings) -> tuple[Path, Path]:
        """The recipe's ComfyUI, installed once (kept: an installed build keeps its torch)."""
        chosen = comfyui_builds.recipe(wanted.version, wanted.sha256, wanted.released, wanted.url)
        async with self._python_locks.setdefault(comfyui.NAME, asyncio.Lock()):
            inventory = self._inventory()
            capabilities = [pythonbuilds.compute_capability(gpu.name) for gpu in inventory.gpus]
            torch = comfyui_builds.torch_builds(inventory.driver_version or None, capabilities)
            found = await comfyui_install.comfyui_for_node(
                chosen, self._config.cache_path, torch, progress=_log_progress
            )
            return found.python, found.main

    async def weights(self, spec: ShardSpec) -> Path:
        """The GGUF file, or the folder of a safetensors repository with every file of it inside."""
        filename = spec.weights_filename or "model.gguf"
        path = await self.blob(spec.model, spec.weights_sha256, filename, spec.weights_size)
        if spec.weights_format != "safetensors":
            return path
        return await self.folder(spec.model, path, spec.weights_sha256, spec.files)

    async def folder(self, model: str, main: Path, main_sha: str, files: tuple[WeightsFile, ...]) -> Path:
        """The folder of ``main`` and ``files``, each fetched (once) by its sha256, named by their digests."""
        fetched = [(main.name, main_sha, main)]
        for extra in files:
            path = await self.blob(model, extra.sha256, extra.filename, extra.size)
            fetched.append((extra.filename, extra.sha256, path))
        return await asyncio.to_thread(weightfiles.model_folder, self.weights_dir, fetched)

    @property
    def weights_dir(self) -> Path:
        """Where fetched files live, each in ``<sha256>/``."""
        return self._config.work_path / "weights"

    async def blob(self, model: str, sha: str, filename: str, size: int) -> Path:
        """A mirrored file fetched once into ``weights/<sha>/``; one found there is reused if it matches."""
        async with self.weights_lock(sha):
            directory = self.weights_dir / sha
            final = directory / filename
            if await asyncio.to_thread(weightfiles.reusable, final, sha):
                self.meters.found(sha, size)
                return final
            directory.mkdir(parents=True, exist_ok=True)
            error: LlmgwError | None = None
            for attempt in range(1, FETCH_ATTEMPTS + 1):
                writer = BlobWriter(final, sha, size)
                offset = await writer.start()
                self.meters.found(sha, offset)
                log.info(
                    "fetching weights %s… for %s from byte %d (attempt %d)",
                    sha[:12],
                    model,
                    offset,
                    attempt,
                )
                try:
                    async for chunk in read_ahead(self._fetch()(sha, offset)):
                        await writer.write(chunk)
                        metrics.WEIGHTS_FETCHED_BYTES.inc(len(chunk))
                        self.meters.advanced(sha, writer.offset)
                    await writer.finish()
                    await asyncio.to_thread(weightfiles.remember_digest, final, sha)
                    return final
                except ChecksumMismatch:
                    raise
                except (ChannelClosed, DownloadError, OSError) as caught:
                    error = caught if isinstance(caught, LlmgwError) else LlmgwError(str(caught))
                    await writer.close()
                    log.warning("fetching weights %s… failed: %s", sha[:12], caught)
            raise LlmgwError(
                f"could not fetch weights {sha[:12]}… for {model}: {error}",
                "check that the control plane's mirror holds them ('llmgw mirror list')",
            )

    async def projector(self, spec: ShardSpec) -> Path | None:
        if not spec.projector_sha256:
            return None
        return await self.blob(
            spec.model, spec.projector_sha256, spec.projector_filename or "mmproj.gguf", spec.projector_size
        )

    async def adapter(self, spec: ShardSpec, adapter: AdapterSpec) -> LaunchAdapter:
        """A LoRA adapter fetched (once) like the weights: a GGUF file, or a PEFT folder of its files."""
        path = await self.blob(spec.model, adapter.sha256, adapter.filename, adapter.size)
        if not adapter.files:
            return LaunchAdapter(adapter.name, path, adapter.scale)
        folder = await self.folder(spec.model, path, adapter.sha256, adapter.files)
        return LaunchAdapter(adapter.name, folder, adapter.scale)

    def weights_lock(self, sha256: str) -> asyncio.Lock:
        """Held while the file ``sha256`` is checked or fetched; whoever removes it holds it too."""
        return self._weights_locks.setdefault(sha256, asyncio.Lock())

    async def prepare(self, spec: ShardSpec) -> Prepared:
        """What the shard's engine starts from; its fetch's progress goes to :attr:`meters` meanwhile."""
        self.meters.begin(spec.replica_id, shard_files(spec))
        try:
            return await self._prepare(spec)
        finally:
            self.meters.end(spec.replica_id)

    async def _prepare(self, spec: ShardSpec) -> Prepared:
        def traced(step: Awaitable[T], name: str, **attributes: str | int) -> Awaitable[T]:
            return _traced(self._traces, spec.replica_id, step, name, **attributes)

        fetching = asyncio.gather(
            *(
                traced(self.adapter(spec, a), "adapter.fetch", adapter=a.name, sha256=a.sha256)
                for a in spec.adapters
            )
        )
        program, weights, projector, adapters = await asyncio.gather(
            traced(self.program(spec.engine), "engine.install", engine=spec.engine or builds.LLAMACPP),
            traced(self.weights(spec), "weights.fetch", sha256=spec.weights_sha256, size=spec.weights_size),
            self.projector(spec),
            fetching,
        )
        entry = (await self.comfyui())[1] if spec.engine == comfyui.NAME else None
        return Prepared(program, weights, projector, tuple(adapters), entry)


async def _traced(
    traces: ShardStartTraces, replica_id: str, step: Awaitable[T], name: str, **attributes: str | int
) -> T:
    """``step`` as a span of the shard's start (just ``step`` when that start is not traced)."""
    with traces.step(replica_id, name, **attributes):
        return await step


def _operator_binary(path: Path) -> Path:
    """The llama-server the operator named in ``engines.llamacpp.binary``, checked to be runnable."""
    if not path.is_file() or not os.access(path, os.X_OK):
        raise LlmgwError(
            f"engines.llamacpp.binary {path} is not an executable file",
            "point it at a llama-server binary, or remove it from agent.yaml to install a build",
        )
    return path


def _log_progress(message: str, fraction: float | None) -> None:
    if fraction is None:
        log.info("engine install: %s", message)
    else:
        log.info("engine install: %s (%.0f%%)", message, fraction * 100)
