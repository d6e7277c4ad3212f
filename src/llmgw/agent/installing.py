"""What a shard needs on disk before its engine starts: the engine build and the weights."""

from __future__ import annotations

import asyncio
import logging
import os
import platform
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from llmgw.agent.config import AgentConfig
from llmgw.core.devices import NodeInventory
from llmgw.engines import builds
from llmgw.errors import ChannelClosed, ChecksumMismatch, DownloadError, LlmgwError
from llmgw.mirror.fetching import BlobWriter
from llmgw.protocol import agent_pb2 as pb

log = logging.getLogger(__name__)

FETCH_ATTEMPTS = 3

BlobFetcher = Callable[[str, int], AsyncIterator[bytes]]


class Installer:
    """Engine builds (cached across the node) and weights (per sha256), each fetched once."""

    def __init__(
        self, config: AgentConfig, inventory: Callable[[], NodeInventory], fetch: Callable[[], BlobFetcher]
    ) -> None:
        self._config = config
        self._inventory = inventory
        self._fetch = fetch
        self._engine_lock = asyncio.Lock()
        self._weights_locks: dict[str, asyncio.Lock] = {}
        self._installed: builds.InstalledBuild | None = None

    def installed_engines(self) -> list[str]:
        """Engine builds on this node, best first, as ``llama.cpp <version> <variant>``."""
        return [
            f"{b.build.engine} {b.build.version} {b.build.variant}"
            for b in builds.installed(self._config.cache_path)
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
                    progress=_log_progress,
                    release_api=self._config.engines.llamacpp.release_api,
                    pypi_url=self._config.engines.llamacpp.pypi_url,
                )
                log.info(
                    "engine build: %s %s %s at %s",
                    self._installed.build.engine,
                    self._installed.build.version,
                    self._installed.build.variant,
                    self._installed.binary,
                )
            return self._installed.binary

    async def weights(self, spec: pb.StartShard) -> Path:
        sha = spec.weights_sha256
        lock = self._weights_locks.setdefault(sha, asyncio.Lock())
        async with lock:
            directory = self._config.work_path / "weights" / sha
            final = directory / (spec.weights_filename or "model.gguf")
            if final.exists():
                return final
            directory.mkdir(parents=True, exist_ok=True)
            error: LlmgwError | None = None
            for attempt in range(1, FETCH_ATTEMPTS + 1):
                writer = BlobWriter(final, sha, spec.weights_size)
                offset = await writer.start()
                log.info(
                    "fetching weights %s… for %s from byte %d (attempt %d)",
                    sha[:12],
                    spec.model,
                    offset,
                    attempt,
                )
                try:
                    async for chunk in self._fetch()(sha, offset):
                        await writer.write(chunk)
                    await writer.finish()
                    return final
                except ChecksumMismatch:
                    raise
                except (ChannelClosed, DownloadError, OSError) as caught:
                    error = caught if isinstance(caught, LlmgwError) else LlmgwError(str(caught))
                    await writer.close()
                    log.warning("fetching weights %s… failed: %s", sha[:12], caught)
            raise LlmgwError(
                f"could not fetch weights {sha[:12]}… for {spec.model}: {error}",
                "check that the control plane's mirror holds them ('llmgw mirror list')",
            )

    async def prepare(self, spec: pb.StartShard) -> tuple[Path, Path]:
        if spec.engine and spec.engine != "llama.cpp":
            raise LlmgwError(f"engine {spec.engine!r} is not available on this node", "use engine llama.cpp")
        binary, weights = await asyncio.gather(self.engine(), self.weights(spec))
        return binary, weights


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
