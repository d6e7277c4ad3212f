"""``llmgw ctl``: look at and change a running cluster through its admin API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from llmgw.cli.adminclient import AdminClient
from llmgw.cli.configuring import config_app
from llmgw.cli.enginecheck import engine_check
from llmgw.cli.mirror import upload
from llmgw.cli.output import console, table
from llmgw.errors import ValidationFailed

app = typer.Typer(help="Look at and change a running cluster.", no_args_is_help=True)
model_app = typer.Typer(help="The model catalog.", no_args_is_help=True)
key_app = typer.Typer(help="API keys for /v1.", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(key_app, name="key")
app.add_typer(config_app, name="config")
app.command("engine-check")(engine_check)

URL = typer.Option(None, "--url", help="Control plane URL (default: $LLMGW_URL or server.yaml).")
TOKEN = typer.Option(None, "--token", help="Admin token (default: $LLMGW_ADMIN_TOKEN or admin.token).")


def client(url: str | None, token: str | None) -> AdminClient:
    return AdminClient.from_environment(url, token)


@app.command()
def status(url: str = URL, token: str = TOKEN) -> None:
    """The cluster's summary: which control plane leads, which stand by, nodes, models, replicas."""
    show_status(client(url, token).get("/api/status"))


def show_status(s: dict[str, Any]) -> None:
    """Print /api/status as a table (shared by 'llmgw status')."""
    planes = s.get("control_planes", [])
    rows: list[tuple[str, Any]] = [
        ("serving", "STOPPED (llmgw start serves again)" if s.get("stopped") else "yes"),
        ("leader", s["leader"] or "none (a failover is under way)"),
        ("standbys", ", ".join(s["standbys"]) or "none"),
    ]
    rows += [
        (f"  {p['name']}", f"{p['role']}, {p['http']}, agents {p['agents']}, seen {p['seen_ago_s']} s ago")
        for p in planes
    ]
    if s.get("vip"):
        where = "on the leader" if s.get("vip_on_leader") else "NOT on the leader: check keepalived"
        rows.append(("floating address", f"{s['vip']} ({where})"))
    rows += [
        ("answered by", s["name"]),
        ("version", s["version"]),
        ("nodes", s["nodes"]),
        ("models", s["models"]),
        ("replicas", f"{s['replicas_ready']} ready of {s['replicas']}"),
    ]
    rows += [("reconciler", s["reconcile_error"])] if s.get("reconcile_error") else []
    rows += [(f"cannot place {model}", why) for model, why in s.get("unplaced", {}).items()]
    table(["", ""], rows)


@app.command()
def nodes(url: str = URL, token: str = TOKEN) -> None:
    """Nodes, connected or known."""
    rows = client(url, token).get("/api/nodes")
    table(
        ["NODE", "CONNECTED", "ADDRESS", "CPU", "MEMORY", "GPUS", "REPLICAS", "ENGINES"],
        [
            (
                n["id"],
                "yes" if n["connected"] else "no",
                n["address"],
                n["cpu_cores"],
                f"{n['memory_mb']} MiB",
                ", ".join(f"{g['index']}:{g['class']}" for g in n["gpus"]) or "-",
                n["replicas"],
                "; ".join(n["engines"]),
            )
            for n in rows
        ],
    )


@app.command()
def replicas(url: str = URL, token: str = TOKEN) -> None:
    """Replicas and their state."""
    rows = client(url, token).get("/api/replicas")
    table(
        ["REPLICA", "MODEL", "NODE", "STATE", "ON", "PORT", "RESTARTS", "ERROR"],
        [
            (
                r["id"],
                r["model"],
                r["node"],
                r["state"],
                r["on"] or "-",
                r["port"] or "-",
                r["restarts"],
                r["error"][:60],
            )
            for r in rows
        ],
    )


@app.command()
def logs(
    replica: str = typer.Argument(..., help="The replica, as 'llmgw ctl replicas' names it."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until interrupted."),
    lines: int = typer.Option(200, "--lines", "-n", help="How many of the last lines to print first."),
    url: str = URL,
    token: str = TOKEN,
) -> None:
    """A replica's engine output, read from its node through the control plane."""
    admin = client(url, token)
    path = f"/api/replicas/{replica}/logs?lines={lines}"
    if not follow:
        for line in admin.get(path)["lines"]:
            console.out(line, highlight=False)
        return
    try:
        for line in admin.stream(path + "&follow=true"):
            console.out(line, highlight=False)
    except KeyboardInterrupt:
        pass


@app.command()
def models(url: str = URL, token: str = TOKEN) -> None:
    """The catalog, with replicas ready of running."""
    _list_models(client(url, token))


def _list_models(admin: AdminClient) -> None:
    rows = admin.get("/api/models")
    table(
        ["MODEL", "ENGINE", "REPLICAS (min/max)", "READY", "ON DEMAND", "WEIGHTS"],
        [
            (
                m["name"],
                m["definition"]["profile"]["engine"],
                f"{m['definition']['replicas']['min']}/{m['definition']['replicas']['max']}",
                f"{m['ready']}/{m['replicas']}",
                "yes" if m["definition"]["on_demand"] else "no",
                m["definition"]["source"]["sha256"][:12],
            )
            for m in rows
        ],
    )


@model_app.command("list")
def model_list(url: str = URL, token: str = TOKEN) -> None:
    """List the catalog."""
    _list_models(client(url, token))


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
    ctx_size: int = typer.Option(4096, "--ctx-size", help="Context length."),
    parallel: int = typer.Option(4, "--parallel", help="Requests one replica serves at once."),
    memory_mb: int = typer.Option(
        None, "--memory-mb", help="Memory a replica needs (default: from the weights)."
    ),
    arg: list[str] = typer.Option([], "--arg", help="Extra engine argument (repeat for more)."),
    url: str = URL,
    token: str = TOKEN,
) -> None:
    """Add a model to the catalog, from flags or a definition file."""
    admin = client(url, token)
    data = _definition(
        definition,
        name,
        weights,
        file,
        admin,
        min_replicas,
        max_replicas,
        on_demand,
        idle_timeout,
        ctx_size,
        parallel,
        memory_mb,
        arg,
    )
    added = admin.request("POST", "/api/models", data)
    console.print(f"added model [bold]{added['name']}[/]; 'llmgw ctl replicas' shows it starting")


def _definition(
    path: Path | None,
    name: str | None,
    weights: str | None,
    file: Path | None,
    admin: AdminClient,
    min_replicas: int | None,
    max_replicas: int | None,
    on_demand: bool,
    idle_timeout: int,
    ctx_size: int,
    parallel: int,
    memory_mb: int | None,
    args: list[str],
) -> dict[str, Any]:
    if path is not None:
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as error:
            raise ValidationFailed(
                [("--definition", f"cannot read {path}: {error}")], "fix the file"
            ) from None
        if name and isinstance(data, dict):
            data["name"] = name
        return data if isinstance(data, dict) else {"": data}
    problems = []
    if not name:
        problems.append(("name", "required (or give --definition FILE)"))
    if not weights and not file:
        problems.append(
            ("--weights", "give --weights SHA256 of a mirrored file, or --file PATH to import one")
        )
    if problems:
        raise ValidationFailed(problems, "see 'llmgw ctl model add --help'")
    if file is not None:
        weights = upload(admin, file)["sha256"]
    low = min_replicas if min_replicas is not None else (0 if on_demand else 1)
    profile: dict[str, Any] = {"ctx_size": ctx_size, "parallel": parallel, "args": list(args)}
    if memory_mb is not None:
        profile["memory_mb"] = memory_mb
    return {
        "name": name,
        "source": {"sha256": weights, "filename": file.name if file else "model.gguf"},
        "profile": profile,
        "replicas": {"min": low, "max": max_replicas if max_replicas is not None else max(low, 1)},
        "on_demand": on_demand,
        "idle_timeout_s": idle_timeout,
    }


@model_app.command("remove")
def model_remove(
    name: str = typer.Argument(..., help="The model to remove."), url: str = URL, token: str = TOKEN
) -> None:
    """Remove a model; its replicas stop."""
    client(url, token).request("DELETE", f"/api/models/{name}")
    console.print(f"removed model {name}")


@key_app.command("create")
def key_create(
    name: str = typer.Argument(..., help="A name for the key (who or what uses it)."),
    owner: str = typer.Option("", help="Owner of the key."),
    url: str = URL,
    token: str = TOKEN,
) -> None:
    """Create an API key; the secret is shown once."""
    created = client(url, token).request("POST", "/api/keys", {"name": name, "owner": owner})
    console.print(f"created key {created['id']} ({created['name']}); the secret is shown only now:")
    print(created["key"])


@key_app.command("list")
def key_list(url: str = URL, token: str = TOKEN) -> None:
    """List API keys (never their secrets)."""
    rows = client(url, token).get("/api/keys")
    table(
        ["ID", "NAME", "PREFIX", "OWNER", "CREATED", "REVOKED"],
        [
            (
                k["id"],
                k["name"],
                k["prefix"] + "…",
                k["owner"] or "-",
                k["created_at"][:19],
                (k["revoked_at"] or "-")[:19],
            )
            for k in rows
        ],
    )


@key_app.command("revoke")
def key_revoke(
    key: str = typer.Argument(..., help="The key's id or name."), url: str = URL, token: str = TOKEN
) -> None:
    """Revoke an API key at once."""
    client(url, token).request("DELETE", f"/api/keys/{key}")
    console.print(f"revoked key {key}")
