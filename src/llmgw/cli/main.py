"""The ``llmgw`` command."""

from __future__ import annotations

import os
import sys

# gRPC's core logs every fork it sees at INFO; the agent forks engines all the time.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
# llmgw forks only to exec (engines, builds): gRPC's fork handlers are not wanted, and the child's
# one has aborted an engine's start ("next_worker->state == KICKED" in ev_epoll1_linux.cc) before
# its exec. Set before grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import typer

import llmgw.cli.mirrorimports  # noqa: F401  (adds "mirror pull", "mirror import-hf", "mirror import-ollama")
from llmgw import __version__
from llmgw.cli import agent, configuring, ctl, doctor, engine, mirror, modelserving, server, serving, up  # noqa: F401  (modelserving adds "model serve")
from llmgw.cli import firewall as firewall_commands
from llmgw.cli import service as service_commands
from llmgw.cli import wipe as wipe_command
from llmgw.cli.bundle import app as bundle_app
from llmgw.cli.comfyuigate import register as register_comfyui_gate
from llmgw.cli.console import console
from llmgw.cli.mirrorbuilds import add_build
from llmgw.cli.nodeadd import app as node_app
from llmgw.cli.output import fail
from llmgw.cli.release import app as release_app
from llmgw.cli.restarting import restart
from llmgw.cli.training import train_app
from llmgw.cli.upgrade import upgrade
from llmgw.errors import LlmgwError

app = typer.Typer(
    name="llmgw",
    help="llmgw: one OpenAI-compatible endpoint over a fleet of machines with GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(server.app, name="server")
app.add_typer(agent.app, name="agent")
app.add_typer(ctl.app, name="ctl")
ctl.app.add_typer(train_app, name="train")
app.add_typer(ctl.model_app, name="model")  # also "llmgw model", with serve (modelserving)
app.add_typer(mirror.app, name="mirror")
mirror.app.command("add-build")(add_build)
app.add_typer(engine.app, name="engine")
app.add_typer(release_app, name="release")
app.add_typer(node_app, name="node")
app.add_typer(bundle_app, name="bundle")
app.command("up")(up.up)
app.command("console")(console)
app.command("doctor")(doctor.doctor)
serving.register(app)
app.command("restart")(restart)
app.add_typer(firewall_commands.app, name="firewall")
app.add_typer(service_commands.app, name="service")
app.command("wipe")(wipe_command.wipe_command)
app.command("upgrade")(upgrade)
register_comfyui_gate(app)


@app.command()
def version() -> None:
    """Print llmgw's version."""
    typer.echo(__version__)


def main() -> None:
    try:
        app()
    except LlmgwError as error:
        fail(error)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
