"""``llmgw console``: the cluster in a terminal (the console package), or its setup where there is none."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import typer

from llmgw.cli.options import TOKEN, URL
from llmgw.client.admin import AdminClient
from llmgw.client.config import load_client_config
from llmgw.client.paths import client_config_path, find_server_config, up_home


def needs_setup(url: str | None, token: str | None, environ: Mapping[str, str]) -> bool:
    """No cluster to show: no URL given, no current context, no server.yaml on this machine."""
    if url or token or environ.get("LLMGW_URL"):
        return False
    if load_client_config(client_config_path(environ)).current() is not None:
        return False
    return find_server_config(environ) is None


def console(
    url: str | None = URL,
    token: str | None = TOKEN,
    home: Path = typer.Option(
        None, "--home", help="Where setup creates a cluster (default: $LLMGW_HOME, as 'llmgw up')."
    ),
) -> None:
    """The cluster full screen: overview, nodes, GPUs, models, replicas, mirror, settings, keys; a Do menu.

    With no cluster yet (no server.yaml, no context) it sets one up on this machine first."""
    from llmgw.console.app import ConsoleApp
    from llmgw.console.setup import SetupChoices, SetupScreen
    from llmgw.console.source import AdminSource

    if needs_setup(url, token, os.environ):

        def reach(choices: SetupChoices) -> AdminSource:
            return AdminSource(AdminClient.from_environment(config=choices.server_yaml))

        directory = (home or up_home()).expanduser().resolve()
        ConsoleApp(setup=(SetupScreen(directory), reach)).run()
        return
    ConsoleApp(AdminSource(AdminClient.from_environment(url, token))).run()
