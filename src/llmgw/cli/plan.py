"""``llmgw ctl plan [MODEL]``: where one more replica of each model would go now, and why not elsewhere."""

from __future__ import annotations

import typer

from llmgw.adminapi.schemas import PlanView
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, table


def plan(
    model: str = typer.Argument(None, help="One model (default: every model of the catalog)."),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Where each model's next replica would go now, and why every other node was turned down."""
    rows = client(url, token).plan(model)
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("the catalog is empty: 'llmgw ctl presets' lists models ready to add")
        return
    table(["MODEL", "NODE", "WHY"], [line for p in rows for line in plan_lines(p)])


def plan_lines(p: PlanView) -> list[tuple[str, str, str]]:
    """One model's plan as table rows: the node chosen first, then each node turned down with why,
    then what eviction would do for it and the last scaling decision."""
    if p.problem and not p.node and not p.refused:
        return [(p.model, "-", p.problem)]
    have = f"{p.replicas} placed of {p.wanted} wanted; one needs {p.memory_mb} MiB"
    profile = f"profile {p.profile}, " if p.profile > 1 else ""
    if p.node:
        labels = p.device_labels or [str(d) for d in p.devices]
        on = f"cards {', '.join(labels)}" if labels else "host memory"
        first = (p.model, p.node, f"CHOSEN ({profile}{on}); {have}")
    elif p.evict or p.waiting_for:
        going = ", ".join(p.evict or p.waiting_for)
        verb = "EVICTING" if p.evict else "WAITING for the drain of"
        first = (
            p.model,
            p.evict_node,
            f"NOWHERE as things are; {verb} {going} ({profile}priority {p.priority}); {have}",
        )
    else:
        first = (p.model, "-", f"NOWHERE; {have}")
    rows = [first] + [("", r.node, r.reason) for r in p.refused]
    rows += [("", r.node, f"not evicted: {r.reason}") for r in p.kept]
    if p.scaling:
        rows.append(("", "-", f"scaling: {p.scaling}"))
    return rows
