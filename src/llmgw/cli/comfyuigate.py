"""``llmgw comfyui-gate``: run a ComfyUI replica's gate (the agent starts it as the replica's engine)."""

from __future__ import annotations

import sys

import typer

from llmgw.engines import comfyui_gate

COMMAND = "comfyui-gate"
_RAW = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def comfyui_gate_command(context: typer.Context) -> None:
    """Serve a ComfyUI replica's port: the replica's key, its routes, ComfyUI as a child (--help: flags)."""
    # The gate's own parser reads the words as given: click would drop the "--" before ComfyUI's.
    argv = sys.argv[sys.argv.index(COMMAND) + 1 :] if COMMAND in sys.argv else list(context.args)
    raise typer.Exit(comfyui_gate.main(argv))


def register(app: typer.Typer) -> None:
    app.command(COMMAND, context_settings=_RAW, add_help_option=False)(comfyui_gate_command)
