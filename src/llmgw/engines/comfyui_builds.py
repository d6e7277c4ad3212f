"""ComfyUI builds: the release a recipe names, and the torch that fits a node's driver and cards.

A recipe names a ComfyUI release: its version, the source archive's URL, the
archive's sha256 (GitHub publishes none for a tag's archive, so a recipe
without one is refused) and the release date. Its requirements are resolved as
PyPI stood the day after the release (uv's ``--exclude-newer``), and a
requirements file naming anything but PyPI packages (URLs, paths, ``-e``,
``--index-url``, ``git+``) is refused, naming the line. A release older than :data:`INTERRUPT_BY_ID` is
refused: its ``POST /interrupt`` ignores ``prompt_id`` and interrupts whatever
runs, so cancelling one tenant's workflow could stop another's.

torch comes first, by driver and card (:func:`torch_builds`, best first):

- ``cu130``: PyPI's torch (its CUDA 13 build), on driver 580 or newer, from
  compute capability 7.5 (Turing);
- ``cu129``: PyTorch's CUDA 12.9 build (``download.pytorch.org/whl/cu129``),
  on driver 525 or newer, from 7.5 as well (PyTorch's CUDA 12.8 and 12.9
  builds start at Turing since torch 2.8);
- ``cu126``: PyTorch's CUDA 12.6 build, for Volta and Pascal (6.0 to 7.0),
  which no newer build carries.

A node keeps the first of its list already installed: an installed ``cu130``
on a Turing card is never replaced (:func:`choose_installed`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

from packaging.version import InvalidVersion, Version

from llmgw.core.comfyui import package_problem
from llmgw.engines.builds import driver_major
from llmgw.errors import BuildError, ValidationFailed

TORCH_PACKAGES = ("torch", "torchvision", "torchaudio")
PYTORCH_INDEX = "https://download.pytorch.org/whl/{variant}"
COMFYUI_ARCHIVE = "https://github.com/comfyanonymous/ComfyUI/archive/refs/tags/v{version}.tar.gz"
SHA256 = re.compile(r"[0-9a-f]{64}")
INTERRUPT_BY_ID = Version("0.3.57")
"""The first ComfyUI release whose ``POST /interrupt`` honours ``prompt_id`` (its PR #9607, commit
464ba1d, 2 September 2025; 0.3.57 was tagged on 4 September): the oldest a node installs."""


@dataclass(frozen=True)
class TorchBuild:
    """One torch for ComfyUI's environment."""

    variant: str
    """``cu130``, ``cu129`` or ``cu126``."""
    index_url: str
    """Where torch comes from: empty for PyPI, else PyTorch's index for the variant."""
    min_driver: int
    min_capability: tuple[int, int]
    max_capability: tuple[int, int] | None = None
    """The newest card it is for (``cu126``: Volta and older); None: any newer."""

    def fits(self, driver: int | None, capability: tuple[int, int] | None) -> bool:
        if driver is not None and driver < self.min_driver:
            return False
        if capability is None:
            return self.max_capability is None
        if capability < self.min_capability:
            return False
        return self.max_capability is None or capability <= self.max_capability

    def install_arguments(self) -> list[str]:
        """``uv pip install``'s arguments for this torch (its index alone where not PyPI's)."""
        index = ["--index-url", self.index_url] if self.index_url else []
        return [*index, *TORCH_PACKAGES]


TORCH_BUILDS = (
    TorchBuild("cu130", "", 580, (7, 5)),
    TorchBuild("cu129", PYTORCH_INDEX.format(variant="cu129"), 525, (7, 5)),
    TorchBuild("cu126", PYTORCH_INDEX.format(variant="cu126"), 525, (6, 0), (7, 0)),
)


def torch_builds(
    driver_version: str | None, capabilities: Sequence[tuple[int, int] | None]
) -> list[TorchBuild]:
    """The torch builds that run on a node's driver and every one of its cards, best first."""
    driver = driver_major(driver_version)
    known = [c for c in capabilities if c is not None]
    oldest = min(known) if known else None
    return [build for build in TORCH_BUILDS if build.fits(driver, oldest)]


def choose_installed(wanted: Sequence[TorchBuild], installed: Sequence[str]) -> TorchBuild | None:
    """The first of ``wanted`` (best first) already installed (``installed`` names variants): the
    build a node keeps rather than installing another; None when none is."""
    return next((build for build in wanted if build.variant in installed), None)


def card_check_command(python: Path) -> list[str]:
    """The command proving torch runs on the card: it computes on each device it sees."""
    code = (
        "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA card'; "
        "[torch.ones(1, device=f'cuda:{i}').add(1).item() for i in range(torch.cuda.device_count())]; "
        "print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
    )
    return [str(python), "-c", code]


@dataclass(frozen=True)
class Recipe:
    """One ComfyUI release, as a node installs it."""

    version: str
    sha256: str
    """The source archive's sha256; required."""
    released: date
    """The release's date: its requirements resolve as PyPI stood the day after."""
    url: str = ""
    """The source archive; empty: GitHub's archive of the tag ``v<version>``."""

    @property
    def archive_url(self) -> str:
        return self.url or COMFYUI_ARCHIVE.format(version=self.version)

    @property
    def exclude_newer(self) -> str:
        """uv's ``--exclude-newer``: the day after the release."""
        return (self.released + timedelta(days=1)).isoformat()

    @property
    def key(self) -> str:
        return f"{self.version}-{self.sha256[:12]}"


def recipe(version: str, sha256: str | None, released: str, url: str = "") -> Recipe:
    """A checked :class:`Recipe`; ValidationFailed naming each field that is wrong."""
    problems = []
    digest = (sha256 or "").removeprefix("sha256:").lower()
    if not digest:
        problems.append(("sha256", "no digest: a ComfyUI release is installed only against its archive's "
                         "sha256 (sha256sum of the downloaded archive)"))  # fmt: skip
    elif not SHA256.fullmatch(digest):
        problems.append(("sha256", "must be 64 hexadecimal digits (the archive's sha256)"))
    if not re.fullmatch(r"[0-9A-Za-z.+-]{1,40}", version):
        problems.append(("version", f"{version!r} is not a version such as 0.3.60"))
    elif (problem := _too_old(version)) is not None:
        problems.append(("version", problem))
    day = None
    try:
        day = date.fromisoformat(released)
    except ValueError:
        problems.append(("released", f"{released!r} is not a date (YYYY-MM-DD, the release's day)"))
    if url and not url.startswith(("https://", "file://")):
        problems.append(("url", "the archive comes over https (or file:// from this node)"))
    if problems or day is None:
        raise ValidationFailed(problems, "fix the ComfyUI recipe (engines.comfyui) and try again")
    return Recipe(version, digest, day, url)


def _too_old(version: str) -> str | None:
    """Why a node never installs ``version``; None when it may."""
    try:
        release = Version(version)
    except InvalidVersion:
        return f"{version!r} is not a release's version such as 0.3.60"
    if release < INTERRUPT_BY_ID:
        return (
            f"ComfyUI {version} is older than {INTERRUPT_BY_ID}, the first release whose /interrupt "
            "stops only the workflow it names (older ones stop whatever runs, another tenant's "
            f"included); name {INTERRUPT_BY_ID} or newer"
        )
    return None


def check_requirements(text: str, where: str = "requirements.txt") -> list[str]:
    """The requirement strings of a requirements file; BuildError naming the first line that names
    anything but a PyPI package."""
    wanted = []
    for number, line in enumerate(text.splitlines(), 1):
        spec = re.sub(r"(^|\s)#.*", "", line).strip()
        if not spec:
            continue
        why = package_problem(spec)
        if why:
            raise BuildError(
                f"{where} line {number} ({line.strip()!r}) names something other than a PyPI package: {why}",
                hint="ComfyUI's environment installs PyPI packages only; use another release or recipe",
            )
        wanted.append(spec)
    return wanted
