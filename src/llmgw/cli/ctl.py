"""``llmgw ctl``: look at and change a running cluster through its admin API.

The commands here look at the cluster (status, nodes, replicas, logs, audit);
the catalog (:mod:`llmgw.cli.modelcatalog`), keys (:mod:`llmgw.cli.keys`),
organizations, teams, projects and users (:mod:`llmgw.cli.tenancy`),
settings (:mod:`llmgw.cli.configuring`), contexts (:mod:`llmgw.cli.contexts`)
and usage (:mod:`llmgw.cli.usage`) have their own modules. Every listing takes ``--json``.
"""

from __future__ import annotations

import time
from typing import Any

import typer

from llmgw.adminapi.schemas import ComponentView, StatusView
from llmgw.cli.configuring import config_app
from llmgw.cli.contexts import context_app
from llmgw.cli.enginecheck import engine_check
from llmgw.cli.keys import key_app
from llmgw.cli.knowledge import kb_app
from llmgw.cli.limits import limits_app
from llmgw.cli.mirror import app as mirror_app
from llmgw.cli.modelcatalog import list_models, model_app
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, shown, table
from llmgw.cli.plan import plan
from llmgw.cli.presets import presets
from llmgw.cli.tenancy import org_app, project_app, team_app, user_app
from llmgw.cli.upgrade import upgrade_app
from llmgw.cli.usage import usage
from llmgw.core.health import ComponentState

__all__ = ["TOKEN", "URL", "app", "client", "model_app", "show_status"]

app = typer.Typer(help="Look at and change a running cluster.", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(key_app, name="key")
app.add_typer(config_app, name="config")
app.add_typer(context_app, name="context")
app.add_typer(org_app, name="org")
app.add_typer(team_app, name="team")
app.add_typer(project_app, name="project")
app.add_typer(user_app, name="user")
app.add_typer(limits_app, name="limits")
app.add_typer(kb_app, name="kb")
app.add_typer(upgrade_app, name="upgrade")
app.add_typer(mirror_app, name="mirror")  # also "llmgw mirror"
app.command("engine-check")(engine_check)
app.command("usage")(usage)
app.command("plan")(plan)
app.command("presets")(presets)

WORTH_SHOWING = (ComponentState.FAILED, ComponentState.RESTARTING)


@app.command()
def status(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """The cluster's summary: which control plane leads, which stand by, nodes, models, replicas."""
    answer = client(url, token).status()
    if as_json:
        print_json(answer)
    else:
        show_status(answer)


def show_status(s: StatusView, now: float | None = None) -> None:
    """Print /api/status as a table (shared by 'llmgw status')."""
    rows: list[tuple[str, Any]] = [
        ("serving", "STOPPED (llmgw start serves again)" if s.stopped else "yes"),
        ("leader", s.leader or "none (a failover is under way)"),
        ("standbys", ", ".join(s.standbys) or "none"),
    ]
    rows += [
        (f"  {p.name}", f"{p.role}, {p.http}, agents {p.agents}, seen {p.seen_ago_s} s ago")
        for p in s.control_planes
    ]
    if s.vip:
        where = "on the leader" if s.vip_on_leader else "NOT on the leader: check keepalived"
        rows.append(("floating address", f"{s.vip} ({where})"))
    rows += [
        ("answered by", s.name),
        ("version", s.version),
        ("nodes", s.nodes),
        ("models", s.models),
        ("replicas", f"{s.replicas_ready} ready of {s.replicas}"),
    ]
    rows += [("reconciler", s.reconcile_error)] if s.reconcile_error else []
    rows += [(f"cannot place {model}", why) for model, why in s.unplaced.items()]
    rows += [
        (f"refused settings on {node}", f"{r.keys}: {r.reason} (runs on its last good settings)")
        for node, r in s.refused_settings.items()
    ]
    rows += [
        (
            f"provider {model}",
            f"{p.served_by}, {p.requests} requests, "
            + (f"last error {p.last_error}" if p.last_error else "no error"),
        )
        for model, p in s.providers.items()
    ]
    rows += [(f"queue {model}", q.summary()) for model, q in s.queues.items()]
    at = time.time() if now is None else now
    rows += [
        (f"component {c.name}", describe_component(c, at)) for c in s.components if c.state in WORTH_SHOWING
    ]
    table(["", ""], rows)


def describe_component(component: ComponentView, now: float) -> str:
    """A failed or restarting component: its state, restarts, last error and when it came."""
    text = f"{component.state.value.upper()} after {component.restarts} restarts"
    if component.last_error:
        text += f": {component.last_error}"
    if component.last_error_at is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(component.last_error_at))
        text += f" (at {when}, {max(0, round(now - component.last_error_at))} s ago)"
    return text


@app.command()
def nodes(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """Nodes, connected or known."""
    rows = client(url, token).nodes()
    if as_json:
        print_json(rows)
        return
    table(
        ["NODE", "CONNECTED", "ADDRESS", "CPU", "MEMORY", "GPUS", "REPLICAS", "ENGINES", "REFUSED SETTINGS"],
        [
            (
                n.id,
                "yes" if n.connected else "no",
                n.address,
                n.cpu_cores,
                f"{n.memory_mb} MiB",
                ", ".join(f"{g.index}:{g.device_class}" for g in n.gpus) or "-",
                n.replicas,
                "; ".join(n.engines),
                f"{n.refused_settings.keys}: {n.refused_settings.reason}" if n.refused_settings else "-",
            )
            for n in rows
        ],
    )


@app.command()
def replicas(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """Replicas and their state."""
    rows = client(url, token).replicas()
    if as_json:
        print_json(rows)
        return
    table(
        ["REPLICA", "MODEL", "NODE", "STATE", "ON", "PORT", "RESTARTS", "ERROR"],
        [
            (
                r.id,
                r.model,
                r.node,
                r.progress or (f"{r.state}, draining" if r.draining else r.state),
                r.on or "-",
                r.port or "-",
                r.restarts,
                (r.draining or r.error or (f"KV: {r.kv_mismatch}" if r.kv_mismatch else ""))[:60],
            )
            for r in rows
        ],
    )


@app.command()
def logs(
    replica: str = typer.Argument(..., help="The replica, as 'llmgw ctl replicas' names it."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until interrupted."),
    lines: int = typer.Option(200, "--lines", "-n", help="How many of the last lines to print first."),
    url: str | None = URL,
    token: str | None = TOKEN,
) -> None:
    """A replica's engine output, read from its node through the control plane."""
    admin = client(url, token)
    if not follow:
        for line in admin.replica_logs(replica, lines).lines:
            console.out(line, highlight=False)
        return
    try:
        for line in admin.follow_replica_logs(replica, lines):
            console.out(line, highlight=False)
    except KeyboardInterrupt:
        pass


@app.command()
def models(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """The catalog, with replicas ready of running."""
    list_models(client(url, token), as_json)


@app.command()
def audit(
    limit: int = typer.Option(50, "--limit", "-n", help="How many entries, newest first."),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Who changed what, newest first: models, keys, settings, serving, restarts."""
    rows = client(url, token).audit(limit)
    if as_json:
        print_json(rows)
        return
    table(
        ["AT", "ACTOR", "ACTION", "TARGET"],
        [(a.at.strftime("%Y-%m-%d %H:%M:%S"), shown(a.actor), a.action, shown(a.target)) for a in rows],
    )
