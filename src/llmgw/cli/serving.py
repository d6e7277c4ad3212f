"""``llmgw stop``, ``llmgw start``, ``llmgw status``: the whole cluster's serving, from any control plane.

``stop`` sets ``serving.stopped``: every model goes to no replicas, freeing
every GPU, and every POST under ``/v1/`` gets 503 ``system_stopped``; control
planes, agents and the mirror keep running, and no model's definition changes.
``start`` clears it.
"""

from __future__ import annotations

import typer

from llmgw.cli.ctl import status
from llmgw.cli.options import TOKEN, URL, client
from llmgw.cli.output import console


def stop(url: str | None = URL, token: str | None = TOKEN) -> None:
    """Stop serving: every model to no replicas, /v1 answers 503 system_stopped; everything keeps running."""
    client(url, token).set_serving(stopped=True)
    console.print("stopped: every replica is being stopped; 'llmgw start' serves again")


def start(url: str | None = URL, token: str | None = TOKEN) -> None:
    """Serve again after 'llmgw stop': every model is placed again as it asks."""
    client(url, token).set_serving(stopped=False)
    console.print("serving: every model is placed again as it asks")


def register(app: typer.Typer) -> None:
    app.command("stop")(stop)
    app.command("start")(start)
    app.command("status")(status)
