"""``llmgw stop``, ``llmgw start``, ``llmgw status``: the whole cluster's serving, from any control plane.

``stop`` sets ``serving.stopped``: every model goes to no replicas, freeing
every GPU, and every POST under ``/v1/`` gets 503 ``system_stopped``; control
planes, agents and the mirror keep running, and no model's definition changes.
``start`` clears it.
"""

from __future__ import annotations

import typer

from llmgw.cli.ctl import show_status
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json


def stop(url: str | None = URL, token: str | None = TOKEN) -> None:
    """Stop serving: every model to no replicas, /v1 answers 503 system_stopped; everything keeps running."""
    client(url, token).set_serving(stopped=True)
    console.print("stopped: every replica is being stopped; 'llmgw start' serves again")


def start(url: str | None = URL, token: str | None = TOKEN) -> None:
    """Serve again after 'llmgw stop': every model is placed again as it asks."""
    client(url, token).set_serving(stopped=False)
    console.print("serving: every model is placed again as it asks")


def status(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """The cluster's summary, saying when it is stopped and which control plane leads."""
    answer = client(url, token).status()
    if as_json:
        print_json(answer)
    else:
        show_status(answer)


def register(app: typer.Typer) -> None:
    app.command("stop")(stop)
    app.command("start")(start)
    app.command("status")(status)
