"""``llmgw ctl model`` (also ``llmgw model``): list, add, scale and remove the catalog's models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from llmgw.cli.mirror import upload, upload_bar
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, table
from llmgw.cli.presets import presets, print_added
from llmgw.client.admin import AdminClient
from llmgw.client.definitions import read_definition
from llmgw.client.presets import add_preset
from llmgw.client.providerkeys import read_key
from llmgw.core.presets import PRESETS
from llmgw.core.providers import served_outside
from llmgw.errors import ValidationFailed

model_app = typer.Typer(help="The model catalog.", no_args_is_help=True)


def list_models(admin: AdminClient, as_json: bool = False) -> None:
    """Print the catalog: engine, replicas wanted, ready of running, on demand, weights."""
    rows = admin.models()
    if as_json:
        print_json(rows)
        return
    out = []
    for m in rows:
        d = m.definition
        if d is None:
            out.append((m.name, "?", "?", f"{m.ready}/{m.replicas}", "?", m.problem))
            continue
        out.append(
            (
                m.name,
                d.profile.engine,
                f"{d.replicas.min}/{d.replicas.max}",
                f"{m.ready}/{m.replicas}",
                "yes" if d.on_demand else "no",
                d.source.sha256[:12] if d.source else served_outside(d) + _last_error(m.provider_error),
            )
        )
    table(["MODEL", "ENGINE", "REPLICAS (min/max)", "READY", "ON DEMAND", "WEIGHTS"], out)


def _last_error(error: str) -> str:
    return f" (last error {error})" if error else ""


@model_app.command("list")
def model_list(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """List the catalog."""
    list_models(client(url, token), as_json)


model_app.command("presets")(presets)


@model_app.command("add")
def model_add(
    name: str = typer.Argument(None, help="The model's name (not needed with --definition)."),
    definition: Path = typer.Option(None, "--definition", "-f", help="A YAML or JSON model definition."),
    weights: str = typer.Option(None, "--weights", help="sha256 of weights already in the mirror."),
    file: Path = typer.Option(None, "--file", help="A GGUF file to import into the mirror and serve."),
    min_replicas: int = typer.Option(
        None, "--min", help="Replicas kept running (default 1; 0 with --on-demand)."
    ),
    max_replicas: int = typer.Option(None, "--max", help="Replicas at most (default: --min, at least 1)."),
    on_demand: bool = typer.Option(
        False, "--on-demand", help="Start when a request arrives; stop when idle."
    ),
    idle_timeout: int = typer.Option(
        600, "--idle-timeout", help="Seconds idle before an on-demand model stops."
    ),
    ctx_size: int = typer.Option(4096, "--ctx-size", help="Context of one request, in tokens."),
    parallel: int = typer.Option(4, "--parallel", help="Requests one replica serves at once."),
    memory_mb: int = typer.Option(
        None, "--memory-mb", help="Memory a replica needs (default: from the weights)."
    ),
    arg: list[str] = typer.Option([], "--arg", help="Extra engine argument (repeat for more)."),
    provider: str = typer.Option(
        None, "--provider", help="Served outside the cluster at this API root (https://api.openai.com/v1)."
    ),
    provider_model: str = typer.Option(None, "--provider-model", help="The provider's name for the model."),
    provider_api: str = typer.Option("openai", "--provider-api", help="openai or anthropic."),
    key_file: Path = typer.Option(None, "--key-file", help="A file holding the provider's key."),
    key_env: str = typer.Option(
        None, "--key-env", help="An environment variable holding the provider's key."
    ),
    max_concurrency: int = typer.Option(
        None, "--max-concurrency", help="Requests sent to the provider at once (default 16)."
    ),
    url: str | None = URL,
    token: str | None = TOKEN,
) -> None:
    """Add a model: a preset by name ('llmgw ctl presets'), from flags or a definition file, or served
    by a provider outside the cluster (--provider URL --provider-model NAME --key-file PATH)."""
    admin = client(url, token)
    if provider is not None:
        section: dict[str, Any] = {"api": provider_api, "base_url": provider, "model": provider_model or name}
        if key := read_key(key_file, key_env, "--key"):
            section["key"] = key
        if max_concurrency is not None:
            section["max_concurrency"] = max_concurrency
        print_added(admin.add_model({"name": name, "provider": section}))
        return
    if name in PRESETS and definition is None and file is None:
        with upload_bar() as progress:
            added = add_preset(admin, PRESETS[name], weights, progress)
        print_added(added)
        return
    if definition is not None:
        data = read_definition(definition, name)
    else:
        if file is not None:
            _check_flags(name, weights or "file")
            weights = upload(admin, file)["sha256"]
        data = _from_flags(
            name,
            weights,
            file.name if file else "model.gguf",
            min_replicas,
            max_replicas,
            on_demand,
            idle_timeout,
            {"ctx_size": ctx_size, "parallel": parallel, "args": list(arg)}
            | ({"memory_mb": memory_mb} if memory_mb is not None else {}),
        )
    print_added(admin.add_model(data))


def _check_flags(name: str | None, weights: str | None) -> None:
    problems = []
    if not name:
        problems.append(("name", "required (or give --definition FILE)"))
    if not weights:
        problems.append(
            ("--weights", "give --weights SHA256 of a mirrored file, or --file PATH to import one")
        )
    if problems:
        raise ValidationFailed(problems, "see 'llmgw ctl model add --help'")


def _from_flags(
    name: str | None,
    weights: str | None,
    filename: str,
    min_replicas: int | None,
    max_replicas: int | None,
    on_demand: bool,
    idle_timeout: int,
    profile: dict[str, Any],
) -> dict[str, Any]:
    _check_flags(name, weights)
    low = min_replicas if min_replicas is not None else (0 if on_demand else 1)
    return {
        "name": name,
        "source": {"sha256": weights, "filename": filename},
        "profile": profile,
        "replicas": {"min": low, "max": max_replicas if max_replicas is not None else max(low, 1)},
        "on_demand": on_demand,
        "idle_timeout_s": idle_timeout,
    }


@model_app.command("show")
def model_show(
    name: str = typer.Argument(..., help="The model to show."),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Show a model's definition (a provider's key shows as 'set', never itself)."""
    entry = client(url, token).model(name)
    if as_json:
        print_json(entry)
        return
    d = entry.definition
    console.print(f"model [bold]{entry.name}[/]" + (f" (owner {d.owner})" if d.owner else ""))
    if d.provider is not None:
        p = d.provider
        console.print(f"provider: {p.api.value} at {p.base_url}, model {p.model}")
        console.print(f"key: {p.key or 'none'}")
        t = p.timeouts
        console.print(
            f"timeouts: connect {t.connect_s:g} s, first byte {t.first_byte_s:g} s, total {t.total_s:g} s"
        )
        console.print(f"max concurrency: {p.max_concurrency}")
    else:
        assert d.source is not None
        console.print(f"weights: {d.source.sha256} ({d.source.filename})")
        console.print(f"engine: {d.profile.engine}; replicas min {d.replicas.min}, max {d.replicas.max}")
    if d.fallbacks:
        console.print(f"fallbacks: {', '.join(d.fallbacks)}")


@model_app.command("scale")
def model_scale(
    name: str = typer.Argument(..., help="The model to scale."),
    min_replicas: int = typer.Option(None, "--min", help="Replicas kept running at all times."),
    max_replicas: int = typer.Option(None, "--max", help="Replicas at most (those above it drain)."),
    drain_timeout: float = typer.Option(
        None, "--drain-timeout", help="Seconds a draining replica's requests get before it stops anyway."
    ),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Change a model's replica counts; replicas above a lower --max drain (their requests finish)."""
    changes = {"min": min_replicas, "max": max_replicas, "drain_timeout_s": drain_timeout}
    given = {key: value for key, value in changes.items() if value is not None}
    if not given:
        raise ValidationFailed([("", "nothing to change")], "give --min, --max or --drain-timeout")
    admin = client(url, token)
    current = admin.model(name).definition.replicas.model_dump(mode="json")
    entry = admin.scale_model(name, {**current, **given})
    if as_json:
        print_json(entry)
        return
    replicas = entry.definition.replicas
    console.print(f"model {name}: replicas min {replicas.min}, max {replicas.max}")


@model_app.command("remove")
def model_remove(
    name: str = typer.Argument(..., help="The model to remove."),
    url: str | None = URL,
    token: str | None = TOKEN,
) -> None:
    """Remove a model; its replicas stop."""
    client(url, token).remove_model(name)
    console.print(f"removed model {name}")
