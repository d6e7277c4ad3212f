"""Setup, for a machine with no cluster yet: ``server init`` and the first node, in the console's frame.

It calls what the commands call: :func:`llmgw.provisioning.clusters.initialise` (CA,
certificate, admin token, server.yaml, store) and
:func:`llmgw.provisioning.clusters.set_up_node` (the node's certificate and agent.yaml,
as ``llmgw up`` makes them for one machine). Both run in a worker thread
(they open the store on their own event loop). Then it says how to start the
two processes and hands the new server.yaml to the console.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Button, Footer, Header, Input, Label, Static

from llmgw.errors import ConfigError, LlmgwError
from llmgw.provisioning.clusters import initialise, set_up_node


@dataclass(frozen=True)
class SetupChoices:
    directory: Path
    """Where server.yaml, the CA, the admin token, the store and agent/agent.yaml go."""
    name: str = "cp1"
    """The control plane's name."""
    http_port: int = 8080
    agent_port: int = 8443
    node_id: str = "local"
    """The first node's name (this machine)."""

    @property
    def server_yaml(self) -> Path:
        return self.directory / "server.yaml"

    @property
    def agent_yaml(self) -> Path:
        return self.directory / "agent" / "agent.yaml"


def set_up(choices: SetupChoices) -> None:
    """A cluster in ``choices.directory`` with this machine as its first node (synchronous)."""
    config = initialise(
        choices.directory,
        name=choices.name,
        http_host="127.0.0.1",
        http_port=choices.http_port,
        agent_host="127.0.0.1",
        agent_port=choices.agent_port,
    )
    set_up_node(config, choices.agent_yaml, choices.node_id)


def start_commands(choices: SetupChoices) -> str:
    """How to start what setup made, one command a line."""
    return (
        f"llmgw server run --config {choices.server_yaml}\n"
        f"llmgw agent run --config {choices.agent_yaml}\n"
        f"(or 'llmgw up --home {choices.directory}' runs both and serves a small model)"
    )


class SetupScreen(Screen[SetupChoices]):
    """The setup form; answers the choices once the cluster and its first node exist."""

    BINDINGS = [("escape", "app.quit", "Quit")]

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="≡")
        with Vertical(id="panel") as panel:
            panel.border_title = "Set up a cluster"
            yield Static(
                "No cluster found here (no server.yaml, no context). This creates one on this machine: "
                "a control plane (CA, certificate, admin token, server.yaml, store) and this machine "
                "as its first node (certificate and agent.yaml).",
                id="intro",
            )
            yield Label("Directory")
            yield Input(str(self.directory), id="directory")
            with Horizontal(classes="row"):
                yield self._field("Control plane name", "name", "cp1")
                yield self._field("HTTP port (/v1, /api)", "http_port", "8080", "integer")
                yield self._field("Agent port", "agent_port", "8443", "integer")
                yield self._field("First node's name", "node_id", socket.gethostname() or "local")
            yield Static("", id="problem", classes="problem")
            yield Button("Create the cluster", id="create", variant="primary")
        yield Footer()

    def _field(
        self, label: str, name: str, value: str, kind: Literal["integer", "text"] = "text"
    ) -> Vertical:
        return Vertical(Label(label), Input(value, id=name, type=kind), classes="field")

    def choices(self) -> SetupChoices:
        def text(name: str) -> str:
            return self.query_one(f"#{name}", Input).value.strip()

        if not text("directory"):
            raise ConfigError("no directory given", "type where the cluster's files go")
        try:
            ports = int(text("http_port")), int(text("agent_port"))
        except ValueError:
            raise ConfigError("a port is not a number", "type the ports as numbers, e.g. 8080") from None
        return SetupChoices(
            Path(text("directory")).expanduser(),
            text("name") or "cp1",
            *ports,
            node_id=text("node_id") or "local",
        )

    @on(Button.Pressed, "#create")
    async def create(self) -> None:
        problem = self.query_one("#problem", Static)
        try:
            choices = self.choices()
            problem.update("creating the cluster…")
            await asyncio.to_thread(set_up, choices)
        except LlmgwError as error:
            problem.update(str(error))
            return
        self.dismiss(choices)
