"""The options every command that talks to a control plane shares, declared once.

``--url`` and ``--token`` (``$LLMGW_URL``, ``$LLMGW_ADMIN_TOKEN``; without
them the client config's current context, then the control plane on this
machine: :mod:`llmgw.client.targets`) and ``--json`` on every listing.
"""

from __future__ import annotations

import typer

from llmgw.client.admin import AdminClient

URL = typer.Option(
    None,
    "--url",
    envvar="LLMGW_URL",
    show_envvar=True,
    help="Control plane URL (default: the client config's current context, then this machine's server.yaml).",
)
TOKEN = typer.Option(
    None,
    "--token",
    envvar="LLMGW_ADMIN_TOKEN",
    show_envvar=True,
    help="Admin token (default: the current context's, then admin.token beside server.yaml).",
)
AS_JSON = typer.Option(False, "--json", help="Print JSON instead of a table.")


def client(url: str | None, token: str | None) -> AdminClient:
    """The admin client for the control plane the options (or their defaults) name."""
    return AdminClient.from_environment(url, token)
