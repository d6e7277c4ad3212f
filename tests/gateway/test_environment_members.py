"""The gateway's catalog view: an environment's members name the entry serving them; the entry is hidden."""

from __future__ import annotations

from llmgw.core.catalog import parse_model
from llmgw.gateway.catalog_view import catalog_entries
from llmgw.testing.comfyui_models import comfyui_model


def test_members_are_served_by_their_environments_entry_and_others_by_themselves() -> None:
    models = [
        parse_model(comfyui_model("flux", "a" * 64, environment="pics")),
        parse_model(comfyui_model("alone", "b" * 64)),
    ]
    served = {entry.name: entry.served_by for entry in catalog_entries(models)}
    assert served == {"flux": "comfyui-env-pics", "alone": ""}
