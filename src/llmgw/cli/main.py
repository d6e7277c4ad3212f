"""The ``llmgw`` command.

Each command's module is imported when that command is asked for, not
before: ``llmgw ctl ...`` loads the client's modules (:mod:`llmgw.client`,
:mod:`llmgw.adminapi`) and never the server's (the store, the gateway,
SQLAlchemy, FastAPI), so it starts in a fraction of the time ``server run``
takes to import. ``llmgw --help`` lists them all, and so imports them all.
"""

from __future__ import annotations

import os
import sys

# gRPC's core logs every fork it sees at INFO; the agent forks engines all the time.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
# llmgw forks only to exec (engines, builds): gRPC's fork handlers are not wanted, and the child's
# one has aborted an engine's start ("next_worker->state == KICKED" in ev_epoll1_linux.cc) before
# its exec. Set before grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from collections.abc import Callable
from functools import cache

import typer
from typer import _click as click  # the click Typer ships and builds on: its groups take its Context
from typer.core import TyperGroup

from llmgw import __version__
from llmgw.cli.output import fail
from llmgw.errors import LlmgwError

Register = Callable[[typer.Typer], None]
"""Puts one top-level command (and only that name) on the Typer given."""


@cache
def _mirror_app() -> typer.Typer:
    """``llmgw mirror`` (also ``ctl mirror``) with the commands its other modules add."""
    import llmgw.cli.mirrorimports  # noqa: F401  (adds "pull", "import-hf", "import-ollama")
    from llmgw.cli import mirror
    from llmgw.cli.mirrorbuilds import add_build

    mirror.app.command("add-build")(add_build)
    return mirror.app


@cache
def _model_app() -> typer.Typer:
    """``llmgw model`` (also ``ctl model``) with ``serve``, which its own module adds."""
    import llmgw.cli.modelserving  # noqa: F401  (adds "model serve")
    from llmgw.cli.ctl import model_app

    return model_app


@cache
def _ctl_app() -> typer.Typer:
    from llmgw.cli import ctl
    from llmgw.cli.batches import batch_app
    from llmgw.cli.training import train_app

    _mirror_app()
    _model_app()
    ctl.app.add_typer(train_app, name="train")
    ctl.app.add_typer(batch_app, name="batch")
    return ctl.app


def _server(app: typer.Typer) -> None:
    from llmgw.cli import server

    app.add_typer(server.app, name="server")


def _agent(app: typer.Typer) -> None:
    from llmgw.cli import agent

    app.add_typer(agent.app, name="agent")


def _engine(app: typer.Typer) -> None:
    from llmgw.cli import engine

    app.add_typer(engine.app, name="engine")


def _release(app: typer.Typer) -> None:
    from llmgw.cli.release import app as release_app

    app.add_typer(release_app, name="release")


def _node(app: typer.Typer) -> None:
    from llmgw.cli.nodeadd import app as node_app

    app.add_typer(node_app, name="node")


def _bundle(app: typer.Typer) -> None:
    from llmgw.cli.bundle import app as bundle_app

    app.add_typer(bundle_app, name="bundle")


def _up(app: typer.Typer) -> None:
    from llmgw.cli import up

    app.command("up")(up.up)


def _console(app: typer.Typer) -> None:
    from llmgw.cli.console import console

    app.command("console")(console)


def _doctor(app: typer.Typer) -> None:
    from llmgw.cli import doctor

    app.command("doctor")(doctor.doctor)


def _serving(app: typer.Typer) -> None:
    from llmgw.cli import serving

    serving.register(app)


def _restart(app: typer.Typer) -> None:
    from llmgw.cli.restarting import restart

    app.command("restart")(restart)


def _firewall(app: typer.Typer) -> None:
    from llmgw.cli import firewall

    app.add_typer(firewall.app, name="firewall")


def _service(app: typer.Typer) -> None:
    from llmgw.cli import service

    app.add_typer(service.app, name="service")


def _wipe(app: typer.Typer) -> None:
    from llmgw.cli import wipe

    app.command("wipe")(wipe.wipe_command)


def _upgrade(app: typer.Typer) -> None:
    from llmgw.cli.upgrade import upgrade

    app.command("upgrade")(upgrade)


def _comfyui_gate(app: typer.Typer) -> None:
    from llmgw.cli.comfyuigate import register

    register(app)


def version() -> None:
    """Print llmgw's version."""
    typer.echo(__version__)


def _version(app: typer.Typer) -> None:
    app.command("version")(version)


COMMANDS: dict[str, Register] = {
    "up": _up,
    "console": _console,
    "doctor": _doctor,
    "stop": _serving,
    "start": _serving,
    "status": _serving,
    "restart": _restart,
    "wipe": _wipe,
    "upgrade": _upgrade,
    "comfyui-gate": _comfyui_gate,
    "version": _version,
    "server": _server,
    "agent": _agent,
    "ctl": lambda app: app.add_typer(_ctl_app(), name="ctl"),
    "model": lambda app: app.add_typer(_model_app(), name="model"),
    "mirror": lambda app: app.add_typer(_mirror_app(), name="mirror"),
    "engine": _engine,
    "release": _release,
    "node": _node,
    "bundle": _bundle,
    "firewall": _firewall,
    "service": _service,
}
"""The top-level commands in the order ``llmgw --help`` lists them, each imported on first use."""


class Commands(TyperGroup):
    """llmgw's top-level commands: those of :data:`COMMANDS`, each built when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            scratch = typer.Typer()
            COMMANDS[cmd_name](scratch)
            self.add_command(typer.main.get_group(scratch).commands[cmd_name], cmd_name)
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    name="llmgw",
    help="llmgw: one OpenAI-compatible endpoint over a fleet of machines with GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Commands,
)


@app.callback()
def _root() -> None:
    # A callback keeps the root a group: with no command of its own (each is built on first use),
    # Typer would otherwise have nothing to make ``llmgw`` of.
    pass


def main() -> None:
    try:
        app()
    except LlmgwError as error:
        fail(error)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
