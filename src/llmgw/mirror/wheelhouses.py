"""vLLM's and SGLang's wheels in the mirror: a wheelhouse downloaded once, installed from by every node.

``llmgw mirror add-build vllm[@VERSION] --variant cu129`` has pip download the
build's wheels and every wheel they need (``pip download --only-binary
:all:``, from the engine's index as a node would install it) on the control
plane's machine, imports each wheel into the mirror under its sha256 and
records the wheelhouse as a build (engine, version, variant, architecture, its
wheels) in ``builds.json``. A node that installs that build fetches the
wheels from the mirror, each checked against its sha256, and installs with
``pip install --no-index --find-links``: nothing goes to an index, so an
offline cluster installs its engines. The wheels are downloaded for the
control plane's own Python and platform unless ``--python-version`` and
``--platform`` say the nodes' (pip's own options).
"""

from __future__ import annotations

import asyncio
import platform
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from llmgw.core.mirrorbuilds import BuildAsset, MirroredBuild
from llmgw.engines.pythonbuilds import LISTINGS, PYPI_SIMPLE_URL, PythonBuild, every_variant
from llmgw.errors import BuildError, ValidationFailed
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.builds import BuildIndex

PYTHON_ENGINES = tuple(sorted(LISTINGS))
"""The engines whose builds are wheels: ``sglang``, ``vllm``."""

Pip = Callable[[Sequence[str]], Awaitable[tuple[int, str]]]
"""Runs pip with arguments; (exit code, what it printed): the seam the tests replace."""


async def run_pip(arguments: Sequence[str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pip", *arguments,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await process.communicate()
    return process.returncode or 0, output.decode(errors="replace")


def python_build(engine: str, version: str, variant: str) -> PythonBuild:
    """The build a node would install for ``engine`` at ``version`` (empty: llmgw's pin) and ``variant``."""
    if engine not in LISTINGS:
        raise ValidationFailed(
            [("ENGINE", f"{engine!r} is not installed from wheels")],
            hint=f"give {' or '.join(PYTHON_ENGINES)}",
        )
    builds = every_variant(engine, version)
    for build in builds:
        if build.variant == variant:
            return build
    known = ", ".join(build.variant for build in builds)
    raise ValidationFailed([("--variant", f"{engine} has no variant {variant!r}")], hint=f"choose {known}")


async def add_wheelhouse(
    blobs: BlobStore,
    index: BuildIndex,
    build: PythonBuild,
    *,
    index_url: str = PYPI_SIMPLE_URL,
    pip_options: Sequence[str] = (),
    pip: Pip = run_pip,
    arch: str = "",
    say: Callable[[str], None] = lambda line: None,
) -> MirroredBuild:
    """Download ``build``'s wheels with pip, import each into the mirror, record the wheelhouse."""
    arch = arch or platform.machine()
    (blobs.root / "tmp").mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="wheelhouse-", dir=blobs.root / "tmp"))
    try:
        say(f"downloading {build.requirement} ({build.variant}) and the wheels it needs from {index_url}")
        arguments = [
            "download", "--disable-pip-version-check", "--quiet", "--only-binary", ":all:",
            "--dest", str(staging), *pip_options, *build.pip_arguments(index_url, arch),
        ]  # fmt: skip
        code, text = await pip(arguments)
        if code != 0:
            raise BuildError(
                f"pip could not download {build.requirement} ({build.variant}): {text.strip()[-2000:]}",
                hint="check the index (--index-url) and, for other nodes' Python, --python-version and "
                "--platform",
            )
        wheels = sorted(await asyncio.to_thread(lambda: list(staging.glob("*.whl"))))
        if not wheels:
            raise BuildError(f"pip downloaded no wheel for {build.requirement}", hint="check the index")
        assets = []
        for wheel in wheels:
            info = await blobs.import_file(wheel)
            assets.append(BuildAsset(wheel.name, info.sha256, info.size))
            say(f"  {wheel.name} ({info.size / 1e6:.1f} MB)")
        held = MirroredBuild(build.engine, build.version, build.variant, arch, tuple(assets))
        index.add(held)
        say(f"added {held.key}: {len(assets)} wheels")
        return held
    finally:
        await asyncio.to_thread(shutil.rmtree, staging, True)
