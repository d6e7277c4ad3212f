"""The Overview: who leads, who stands by, the floating address, serving or stopped, and what needs
attention (failed components, refused settings, failed replicas, nodes away, models unplaced)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from llmgw.console.state import ClusterData
from llmgw.core.health import ComponentState

TROUBLED = (ComponentState.FAILED, ComponentState.RESTARTING)


def attention(data: ClusterData, now: float) -> list[tuple[str, str]]:
    """Each thing that needs someone, as (what, why); empty when all is well."""
    out: list[tuple[str, str]] = []
    s = data.status
    if s is not None:
        if s.reconcile_error:
            out.append(("reconciler", s.reconcile_error))
        for c in s.components:
            if c.state in TROUBLED:
                why = f"{c.state.value.upper()} after {c.restarts} restarts"
                why += f": {c.last_error}" if c.last_error else ""
                if c.last_error_at is not None:
                    why += f" ({max(0, round(now - c.last_error_at))} s ago)"
                out.append((f"component {c.name}", why))
        for node, refused in s.refused_settings.items():
            out.append((f"refused settings on {node}", f"{refused.keys}: {refused.reason}"))
        out += [(f"cannot place {model}", why) for model, why in s.unplaced.items()]
        if s.vip and not s.vip_on_leader:
            out.append(("floating address", f"{s.vip} is NOT on the leader: check keepalived"))
    out += [
        (f"replica {r.id}", f"FAILED on {r.node or 'no node'}" + (f": {r.error}" if r.error else ""))
        for r in data.replicas
        if r.state == "failed"
    ]
    out += [
        (f"node {n.id}", f"away (last at {n.address or 'no address'})") for n in data.nodes if not n.connected
    ]
    return out


def overview_table(data: ClusterData, now: float) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    s = data.status
    if s is None:
        grid.add_row("status", "waiting for the control plane…")
        return grid
    grid.add_row(
        "serving",
        Text("STOPPED (Do ▸ Start the cluster serves again)", style="bold red") if data.stopped else "yes",
    )
    grid.add_row("leader", s.leader or Text("none (a failover is under way)", style="yellow"))
    grid.add_row("standbys", ", ".join(s.standbys) or "none")
    for p in s.control_planes:
        grid.add_row(f"  {p.name}", f"{p.role}, {p.http}, agents {p.agents}, seen {p.seen_ago_s:g} s ago")
    if s.vip:
        where = (
            Text("on the leader", style="green")
            if s.vip_on_leader
            else Text("NOT on the leader", style="red")
        )
        grid.add_row("floating address", Text.assemble(f"{s.vip} (", where, ")"))
    else:
        grid.add_row("floating address", "none")
    away = sum(1 for n in data.nodes if not n.connected)
    grid.add_row("nodes", f"{s.nodes}" + (f" ({away} away)" if away else ""))
    grid.add_row("models", str(s.models))
    grid.add_row("replicas", f"{s.replicas_ready} ready of {s.replicas}")
    grid.add_row("answered by", f"{s.name}, llmgw {s.version}")
    for model, queue in s.queues.items():
        grid.add_row(f"queue {model}", Text(queue.summary(), style="yellow" if queue.waiting else ""))
    grid.add_row("", "")
    needs = attention(data, now)
    grid.add_row(Text("needs attention", style="bold"), "nothing" if not needs else "")
    for what, why in needs:
        grid.add_row(Text(f"  {what}", style="red"), why)
    return grid


class OverviewView(Static):
    """The cluster at a glance."""

    title = "Overview"
    needs: tuple[str, ...] = ()

    def show(self, data: ClusterData, now: float) -> None:
        self.update(overview_table(data, now))
