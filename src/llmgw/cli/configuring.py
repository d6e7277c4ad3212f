"""``llmgw ctl config``: the cluster's settings (``llmgw restart`` is :mod:`llmgw.cli.restarting`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
import yaml

from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, table
from llmgw.errors import ValidationFailed

config_app = typer.Typer(
    help="The cluster's settings, with their history. Agents' settings live under agents.default "
    "and agents.nodes.<id>: everything agent.yaml says but node_id, control_planes, address and tls.",
    no_args_is_help=True,
)


def _show(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=True, default_flow_style=False).strip()


@config_app.command("set")
def config_set(
    key: str = typer.Argument(..., help="The setting, e.g. agents.default or agents.nodes.gpu1."),
    value: str = typer.Argument(None, help="Its value as YAML, e.g. 'shards: {stop_grace_s: 30}'."),
    file: Path = typer.Option(None, "--file", "-f", help="Read the value from this YAML file."),
    url: str | None = URL,
    token: str | None = TOKEN,
) -> None:
    """Set a setting; agents' settings are checked as agent.yaml is and reach the nodes a second later."""
    if (value is None) == (file is None):
        raise ValidationFailed([("value", "give the value or --file, one of them")], "see --help")
    try:
        parsed = yaml.safe_load(file.read_text() if file is not None else value)
    except (OSError, yaml.YAMLError) as error:
        raise ValidationFailed([("value", f"not YAML: {error}")], "write the value as YAML") from None
    answer = client(url, token).set_setting(key, parsed)
    console.print(f"set {key}")
    for warning in answer.warnings:
        console.print(f"warning: {warning}", style="yellow", highlight=False)


@config_app.command("get")
def config_get(
    key: str = typer.Argument(..., help="The setting."),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Print a setting's value as YAML."""
    got = client(url, token).setting(key)
    if as_json:
        print_json(got)
    else:
        print(_show(got.value))


@config_app.command("unset")
def config_unset(
    key: str = typer.Argument(..., help="The setting."), url: str | None = URL, token: str | None = TOKEN
) -> None:
    """Remove a setting (its history stays)."""
    client(url, token).unset_setting(key)
    console.print(f"removed {key}")


@config_app.command("list")
def config_list(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """Every setting that is set, with its value."""
    values = client(url, token).settings()
    if as_json:
        print_json(values)
        return
    table(["KEY", "VALUE"], [(key, json.dumps(value)) for key, value in values.items()])


@config_app.command("history")
def config_history(
    key: str = typer.Argument(None, help="One setting (default: every setting)."),
    limit: int = typer.Option(50, "--limit", "-n", help="How many changes, newest first."),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Changes of the settings, newest first: when, who, what."""
    rows = client(url, token).settings_history(key, limit)
    if as_json:
        print_json(rows)
        return
    table(
        ["AT", "ACTOR", "KEY", "VALUE"],
        [
            (
                c.at.strftime("%Y-%m-%d %H:%M:%S"),
                c.actor,
                c.key,
                "(removed)" if c.deleted else json.dumps(c.value),
            )
            for c in rows
        ],
    )
