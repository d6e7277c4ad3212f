"""Pulls: a model's files fetched from Hugging Face or Ollama's registry into the mirror, as a job.

``Pulls.start("hf:ORG/REPO@REV" | "ollama:NAME:TAG", token)`` starts a job on
the control plane and answers at once; the job's files, bytes received, state
and (once done) the model's catalog source are read from :meth:`Pulls.get`.
Each file is checked against the registry's own checksum before it enters the
mirror (:mod:`llmgw.mirror.downloading`); what a cut download kept stays under
``<mirror>/pulls/`` for the next pull to resume.

Addresses come from the cluster settings ``mirror.hf_endpoint`` (else the
control plane's ``HF_ENDPOINT``, else ``https://huggingface.co``) and
``mirror.ollama_registry`` (else ``https://registry.ollama.ai``). A Hugging Face
token is the one passed for the pull, else the control plane's ``HF_TOKEN``;
it is held by the running job alone: never shown, logged or stored.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from llmgw.core.settingtypes import HF_ENDPOINT_SETTING, OLLAMA_REGISTRY_SETTING
from llmgw.errors import DownloadError, LlmgwError, NotFound, ValidationFailed
from llmgw.mirror import huggingface, ollama
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.downloading import Downloader, Refusal, Wanted
from llmgw.mirror.registries import HubSession, hub_refusal, registry_refusal
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.store.database import Store

log = logging.getLogger(__name__)


@dataclass
class PullFile:
    """One file of a pull: its name, size, bytes received, and once in the mirror its sha256."""

    filename: str
    size: int
    done: int = 0
    sha256: str = ""
    checked_by: str = ""


@dataclass
class Pull:
    """A pull job as it goes on."""

    id: str
    source: str
    started: float
    actor: str
    state: str = "running"
    """``running``, ``done`` or ``failed``."""
    revision: str = ""
    """The commit (Hugging Face) or tag (Ollama) pulled."""
    files: list[PullFile] = field(default_factory=list)
    error: str = ""
    hint: str = ""
    catalog_source: dict[str, Any] | None = None
    """The model's ``source`` for a definition, once done."""
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def bytes_done(self) -> int:
        return sum(f.done for f in self.files)

    @property
    def bytes_total(self) -> int:
        return sum(f.size for f in self.files)


def normalized(source: str) -> str:
    """``source`` as a pull names it (``hf:ORG/REPO@REV``, ``ollama:NAME:TAG``), or ValidationFailed."""
    if source.startswith("hf:"):
        return str(huggingface.parse_ref(source))
    if source.startswith("ollama:"):
        return str(ollama.parse_name(source))
    raise ValidationFailed(
        [("source", f"{source!r} names no registry")],
        "write hf:ORG/REPO[@REVISION] (Hugging Face) or ollama:NAME[:TAG] (Ollama's registry)",
    )


class Pulls:
    """The pull jobs of this control plane (kept in memory; partial files on disk)."""

    def __init__(
        self,
        blobs: BlobStore,
        store: Store,
        *,
        environ: Mapping[str, str] = os.environ,
        clock: Clock = SYSTEM_CLOCK,
        tries: int = 5,
        backoff_s: float = 1.0,
    ) -> None:
        self.blobs = blobs
        self.store = store
        self.environ = environ
        self.clock = clock
        self.tries = tries
        self.backoff_s = backoff_s
        self._pulls: dict[str, Pull] = {}
        self._writing: dict[str, asyncio.Lock] = {}
        """One lock per partial file: two pulls sharing a file take turns (the second finds it kept)."""

    def all(self) -> list[Pull]:
        return sorted(self._pulls.values(), key=lambda p: p.started)

    def get(self, pull_id: str) -> Pull:
        pull = self._pulls.get(pull_id)
        if pull is None:
            raise NotFound(f"no pull {pull_id!r}", "list the pulls with GET /api/mirror/pulls")
        return pull

    def start(self, source: str, actor: str, token: str | None = None) -> Pull:
        """Start pulling ``source`` (or answer the pull of it already running)."""
        name = normalized(source)
        for pull in self._pulls.values():
            if pull.source == name and pull.state == "running":
                return pull
        pull = Pull(uuid.uuid4().hex[:12], name, self.clock.time(), actor)
        self._pulls[pull.id] = pull
        pull.task = asyncio.create_task(self._run(pull, token), name=f"pull {name}")
        return pull

    async def wait(self, pull_id: str) -> Pull:
        """The pull once it ended (done or failed)."""
        pull = self.get(pull_id)
        if pull.task is not None:
            await asyncio.shield(pull.task)
        return pull

    async def close(self) -> None:
        """Stop every running pull (what arrived stays for a later one)."""
        tasks = [p.task for p in self._pulls.values() if p.task is not None and not p.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, pull: Pull, token: str | None) -> None:
        try:
            timeout = aiohttp.ClientTimeout(sock_connect=30, sock_read=120)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                if pull.source.startswith("hf:"):
                    await self._pull_hf(pull, session, token or self.environ.get("HF_TOKEN") or None)
                else:
                    await self._pull_ollama(pull, session)
            await self.store.audit.record(pull.actor, "mirror.pull", pull.source, {"revision": pull.revision})
            pull.state = "done"
        except asyncio.CancelledError:
            pull.state, pull.error = "failed", "the control plane stopped during the pull"
            pull.hint = "pull again: what arrived is kept and the pull resumes from there"
            raise
        except LlmgwError as error:
            pull.state, pull.error, pull.hint = "failed", error.message, error.hint
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            pull.state, pull.error = "failed", f"{pull.source}: {type(error).__name__}: {error}"
            pull.hint = "check that the control plane reaches the registry, then pull again"
        if pull.state == "failed":
            log.warning("pull %s failed: %s", pull.source, pull.error)

    def _downloader(
        self, session: aiohttp.ClientSession, headers: dict[str, str], refusal: Refusal
    ) -> Downloader:
        return Downloader(
            session,
            self.blobs.root / "pulls",
            headers=headers,
            refusal=refusal,
            clock=self.clock,
            tries=self.tries,
            backoff_s=self.backoff_s,
        )

    async def _keep(self, pull: Pull, downloader: Downloader, wanted: Wanted, entry: PullFile) -> str:
        """Download, check and move one file into the mirror; its sha256."""

        def progress(done: int) -> None:
            entry.done = done

        known = wanted.sha256 or ""
        async with self._writing.setdefault(wanted.key, asyncio.Lock()):
            held: bool = await asyncio.to_thread(self.blobs.has, known) if known else False
            if held:
                sha256 = known  # kept by an earlier pull or import, checked then
                entry.done = wanted.size
            else:
                path, sha256 = await downloader.fetch(wanted, progress)
                await self.blobs.adopt(path, sha256, wanted.filename)
        await self.store.blobs.add(sha256, wanted.size, wanted.filename, "weights", owner=pull.actor)
        entry.sha256, entry.checked_by = sha256, wanted.checked_by
        return sha256

    async def _setting(self, key: str, fallback: str) -> str:
        value = await self.store.settings.get(key, None)
        return value if isinstance(value, str) and value else fallback

    async def _pull_hf(self, pull: Pull, session: aiohttp.ClientSession, token: str | None) -> None:
        ref = huggingface.parse_ref(pull.source)
        endpoint = await self._setting(
            HF_ENDPOINT_SETTING, self.environ.get("HF_ENDPOINT") or huggingface.DEFAULT_ENDPOINT
        )
        hub = HubSession(session, endpoint, ref, token)
        pull.revision = await hub.commit()
        remote = [f for f in await hub.tree(pull.revision) if huggingface.kept(f.path)]
        if not any(f.path.endswith(".safetensors") for f in remote) or not any(
            f.path == "config.json" for f in remote
        ):
            raise ValidationFailed(
                [("source", f"{pull.source} holds no .safetensors weights with a config.json at its top")],
                "pull a repository of safetensors weights (a GGUF model comes from ollama:NAME)",
            )
        pull.files = [PullFile(f.path, f.size) for f in remote]
        downloader = self._downloader(session, hub.headers, hub_refusal(ref))
        kept = []
        for file, entry in zip(remote, pull.files, strict=True):
            url = huggingface.resolve_url(endpoint, ref, pull.revision, file.path)
            wanted = Wanted(file.path, url, file.size, file.sha256, None if file.sha256 else file.git_sha1)
            kept.append((file.path, await self._keep(pull, downloader, wanted, entry), file.size))
        pull.catalog_source = huggingface.safetensors_source(kept)

    async def _pull_ollama(self, pull: Pull, session: aiohttp.ClientSession) -> None:
        name = ollama.parse_name(pull.source)
        registry = await self._setting(OLLAMA_REGISTRY_SETTING, ollama.DEFAULT_REGISTRY)
        url = ollama.manifest_url(registry, name)
        async with session.get(url, headers={"Accept": ollama.MANIFEST_MEDIA_TYPE}) as answer:
            if answer.status != 200:
                raise registry_refusal(name)(answer.status, answer.headers, url)
            try:
                manifest = await answer.json(content_type=None)
            except ValueError as error:
                raise DownloadError(
                    f"{url} answered no JSON manifest",
                    "check that mirror.ollama_registry names an Ollama registry",
                ) from error
        layers = ollama.parse_manifest(manifest, name)
        pull.revision = name.tag
        parts = [(name.filename, layers.model)]
        if layers.projector is not None:
            parts.append(("mmproj.gguf", layers.projector))
        pull.files = [PullFile(filename, layer.size) for filename, layer in parts]
        downloader = self._downloader(session, {}, registry_refusal(name))
        kept = []
        for (filename, layer), entry in zip(parts, pull.files, strict=True):
            wanted = Wanted(filename, ollama.blob_url(registry, name, layer.sha256), layer.size, layer.sha256)
            kept.append((await self._keep(pull, downloader, wanted, entry), layer.size))
        pull.catalog_source = ollama.gguf_source(name, kept[0], kept[1] if len(kept) > 1 else None)
