"""``llmgw comfyui-gate``: run a ComfyUI replica's gate (the agent starts it as the replica's engine)."""

from __future__ import annotations

import typer

from llmgw.engines import comfyui_gate

_RAW = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def comfyui_gate_command(context: typer.Context) -> None:
    """Serve a ComfyUI replica's port: the replica's key, its routes, ComfyUI as a child (--help: flags)."""
    raise typer.Exit(comfyui_gate.main(list(context.args)))


def register(app: typer.Typer) -> None:
    app.command("comfyui-gate", context_settings=_RAW, add_help_option=False)(comfyui_gate_command)
