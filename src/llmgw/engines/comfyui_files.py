"""A ComfyUI replica's base directory: its weights under their own names, its Hugging Face cache.

The gate gives ComfyUI ``--base-directory D`` (ComfyUI's ``folder_paths``
then reads models from ``D/models/<kind>/``, writes to ``D/output`` and reads
``D/input``, ``D/custom_nodes`` and ``D/user``). Before ComfyUI starts:

- each weights file is linked as ``D/models/<kind>/<name>`` to the fetched
  file, so a workflow names it by its own name. A name given as
  ``kind/name`` goes to that kind's folder (``vae/ae.safetensors``); a bare
  name goes to every folder of a weights kind, so whichever loader node a
  workflow uses finds it. Two files of one name (and different contents)
  are refused: a workflow could not say which it means.
- a model's Hugging Face repository (a folder of its files) is linked into
  ``D/hf/hub/models--ORG--NAME/snapshots/<rev>/`` with ``refs/main`` naming
  ``<rev>``, the layout ``huggingface_hub`` reads; ComfyUI runs with
  ``HF_HOME=D/hf`` and ``HF_HUB_OFFLINE=1``, so nothing goes to the network.

Every link is made again at each start (the files fetched may have changed).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from llmgw.errors import ConfigError

WEIGHT_KINDS = (
    "checkpoints",
    "diffusion_models",
    "vae",
    "text_encoders",
    "clip_vision",
    "loras",
    "controlnet",
    "upscale_models",
    "embeddings",
    "style_models",
    "vae_approx",
    "model_patches",
    "audio_encoders",
)
"""ComfyUI's model folders (``folder_paths.folder_names_and_paths``) that hold weights files."""

MODELS = "models"
HF_DIR = "hf"
OWN_DIRS = ("input", "output", "temp", "user", "custom_nodes")


@dataclass(frozen=True)
class WeightLink:
    """One weights file as ComfyUI is shown it."""

    name: str
    """Its own name, as a workflow gives it."""
    kinds: tuple[str, ...]
    """The model folders it appears in."""
    path: Path
    """The fetched file."""


def parse_pairs(given: Iterable[str], flag: str) -> list[tuple[str, Path]]:
    """``NAME=PATH`` arguments as pairs; ConfigError naming the one that is not."""
    pairs = []
    for item in given:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"{flag} {item!r} is not NAME=PATH", hint=f"give {flag} as NAME=PATH")
        pairs.append((name, Path(path)))
    return pairs


def weight_links(weights: Iterable[tuple[str, Path]]) -> list[WeightLink]:
    """Where each weights file goes; ConfigError for an unknown kind or two files of one name."""
    links: dict[str, WeightLink] = {}
    for given, path in weights:
        kind, _, name = given.rpartition("/")
        if kind and kind not in WEIGHT_KINDS:
            raise ConfigError(
                f"weights {given!r} name the model folder {kind!r}, which ComfyUI has not",
                hint=f"name the file bare or as KIND/NAME with KIND one of {', '.join(WEIGHT_KINDS)}",
            )
        if not name or name.startswith(".") or "\\" in name:
            raise ConfigError(
                f"weights name {given!r} is not a file name", hint="name each file by its own name"
            )
        link = WeightLink(name, (kind,) if kind else WEIGHT_KINDS, path)
        earlier = links.get(name)
        if earlier is not None and not _same_file(earlier.path, path):
            raise ConfigError(
                f"two weights files are named {name}: {earlier.path} and {path}",
                hint="ComfyUI finds weights by their names, so each file of a replica needs its own name; "
                "rename one of them in the model's source",
            )
        links[name] = link
    return list(links.values())


def _same_file(one: Path, other: Path) -> bool:
    try:
        return one.resolve() == other.resolve() or one.samefile(other)
    except OSError:
        return False


def prepare_base(base: Path, links: Iterable[WeightLink], hf_repos: Mapping[str, Path] = {}) -> None:
    """Make ``base`` ComfyUI's base directory with ``links`` and ``hf_repos`` in it; blocking."""
    base.mkdir(parents=True, exist_ok=True)
    for own in OWN_DIRS:
        (base / own).mkdir(exist_ok=True)
    models = base / MODELS
    shutil.rmtree(models, ignore_errors=True)
    for kind in WEIGHT_KINDS:
        (models / kind).mkdir(parents=True)
    for link in links:
        if not link.path.is_file():
            raise ConfigError(
                f"weights file {link.path} ({link.name}) does not exist",
                hint="the agent fetches every weights file before it starts the gate; start the replica again"
                " (llmgw ctl replicas)",
            )
        for kind in link.kinds:
            (models / kind / link.name).symlink_to(link.path.resolve())
    hub = base / HF_DIR / "hub"
    shutil.rmtree(hub, ignore_errors=True)
    for repo, folder in hf_repos.items():
        link_hf_repo(hub, repo, folder)


def link_hf_repo(hub: Path, repo: str, folder: Path) -> Path:
    """Link ``folder``'s files as the cached snapshot of ``repo`` under ``hub``; the snapshot folder."""
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or any(p.startswith(".") for p in parts):
        raise ConfigError(
            f"{repo!r} is not a Hugging Face repository name",
            hint="give it as ORG/NAME, for example stabilityai/TripoSR",
        )
    if not folder.is_dir():
        raise ConfigError(
            f"the files of {repo} are not at {folder}",
            hint="the agent fetches the repository's files before the gate starts; start the replica again",
        )
    revision = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()
    cached = hub / f"models--{parts[0]}--{parts[1]}"
    snapshot = cached / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (cached / "refs").mkdir()
    (cached / "refs" / "main").write_text(revision)
    for root, _, files in os.walk(folder, followlinks=True):
        for name in files:
            source = Path(root) / name
            target = snapshot / source.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source.resolve())
    return snapshot


def child_environment(base: Path, environ: Mapping[str, str], overlay: Path | None = None) -> dict[str, str]:
    """ComfyUI's environment: the gate's, with the Hugging Face cache its own and offline, and the
    custom nodes' packages (``overlay``) importable before ComfyUI's own environment."""
    env = {**environ, "HF_HOME": str(base / HF_DIR), "HF_HUB_OFFLINE": "1"}
    if overlay is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(overlay), environ.get("PYTHONPATH", "")) if p)
    return env
