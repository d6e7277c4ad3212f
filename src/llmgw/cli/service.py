"""``llmgw service install|status|start|stop|restart [server|agent]``: this machine's units (C10.1).

Without a role, ``install`` takes each role whose configuration is in the
configuration directory (server.yaml, agent.yaml) and the others take each
role whose unit is installed. ``--root`` acts on the units under another root
directory (an image being prepared, a test): files are written there and
``systemctl --root`` enables them, without asking a running systemd.
"""

from __future__ import annotations

import pwd
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import typer

from llmgw.cli.output import console, print_json, table
from llmgw.errors import LlmgwError
from llmgw.operations.units import (
    ROLES,
    SERVICE_USER,
    Systemd,
    UnitPaths,
    act,
    install_units,
    installed_roles,
    unit_name,
)

app = typer.Typer(help="This machine's llmgw units (systemd).", no_args_is_help=True)

ROLE_ARGUMENT = typer.Argument(None, help="server or agent (default: both, where installed).")
ROOT_OPTION = typer.Option(Path("/"), "--root", help="Act on the units under this root directory.")


def _roles(role: str | None, root: Path, action: str) -> list[str]:
    if role is not None:
        if role not in ROLES:
            raise LlmgwError(f"there is no llmgw unit {role!r}", hint="name server or agent, or neither")
        return [role]
    roles = installed_roles(root)
    if not roles:
        raise LlmgwError(
            f"no llmgw unit is installed under {root} to {action}",
            hint="install them first: 'llmgw service install'",
        )
    return roles


def _systemd(root: Path) -> Systemd:
    return Systemd(root=None if root == Path("/") else root)


def _executable() -> str:
    argv0 = Path(sys.argv[0])
    if argv0.name == "llmgw" and argv0.exists():
        return str(argv0.resolve())
    found = shutil.which("llmgw")
    if found is None:
        raise LlmgwError("cannot tell where the llmgw command is", hint="give it with --executable PATH")
    return str(Path(found).resolve())


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@app.command()
def install(
    role: str = ROLE_ARGUMENT,
    root: Path = ROOT_OPTION,
    executable: str = typer.Option("", help="The llmgw command the units run (default: this one)."),
    config_dir: str = typer.Option("/etc/llmgw", help="Where server.yaml and agent.yaml are."),
    state_dir: str = typer.Option("/var/lib/llmgw", help="The control plane's data directory."),
) -> None:
    """Write the units with this machine's paths, reload systemd and enable them (start them yourself)."""
    if role is not None:
        roles = _roles(role, root, "install")
    else:
        configs = root / config_dir.lstrip("/")
        roles = [r for r in ROLES if (configs / f"{r}.yaml").exists()]
        if not roles:
            raise LlmgwError(
                f"neither server.yaml nor agent.yaml is in {configs}",
                hint="name the unit (llmgw service install server|agent), or write the configuration first",
            )
    paths = UnitPaths(executable or _executable(), config_dir, state_dir)
    written = install_units(roles, paths, root, _systemd(root), user_exists=_user_exists(SERVICE_USER))
    for path in written:
        console.print(f"wrote {path}")
    console.print(f"enabled {', '.join(unit_name(r) for r in roles)}; start: llmgw service start")


@app.command()
def status(
    role: str = ROLE_ARGUMENT,
    root: Path = ROOT_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the units' states as JSON."),
) -> None:
    """Each unit's state: active, enabled, main pid."""
    systemd = _systemd(root)
    states = [systemd.state(unit_name(r)) for r in _roles(role, root, "show")]
    if as_json:
        print_json([asdict(s) for s in states])
        return
    rows = [(s.unit, f"{s.active} ({s.sub})", s.enabled, s.pid or "") for s in states]
    table(["UNIT", "STATE", "ENABLED", "PID"], rows)


def _action(action: str, role: str | None, root: Path) -> None:
    units = act(action, _roles(role, root, action), _systemd(root))
    console.print(f"{action}: {', '.join(units)}")


@app.command()
def start(role: str = ROLE_ARGUMENT, root: Path = ROOT_OPTION) -> None:
    """Start the units (the control plane first)."""
    _action("start", role, root)


@app.command()
def stop(role: str = ROLE_ARGUMENT, root: Path = ROOT_OPTION) -> None:
    """Stop the units (the agent first; its engines keep running, adopted when it starts again)."""
    _action("stop", role, root)


@app.command()
def restart(role: str = ROLE_ARGUMENT, root: Path = ROOT_OPTION) -> None:
    """Restart the units; engines keep serving through the agent's restart."""
    _action("restart", role, root)
