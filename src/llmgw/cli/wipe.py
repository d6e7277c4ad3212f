"""``llmgw wipe``: take llmgw off this machine, after listing what goes and asking its name (C10.3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from llmgw.cli.output import console, print_json, table
from llmgw.errors import LlmgwError
from llmgw.provisioning.wipe import WipeFailed, check_typed_name, run_wipe, wipe_plan


def wipe_command(
    models: bool = typer.Option(False, "--models", help="Also the weights (the mirror's and the node's)."),
    store: bool = typer.Option(False, "--store", help="Also the store (the SQLite database)."),
    everything: bool = typer.Option(False, "--all", help="Everything: --models and --store."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would go."),
    yes_i_mean: str = typer.Option("", "--yes-i-mean", help="This machine's name: no question (scripts)."),
    root: Path = typer.Option(Path("/"), "--root", help="Wipe llmgw under this root directory."),
    as_json: bool = typer.Option(False, "--json", help="Print what goes (and what was done) as JSON."),
) -> None:
    """Remove llmgw from this machine: units, engines, the nft table, configuration, state, the CA
    from the trust store, keepalived's configuration llmgw wrote, its users."""
    planned = wipe_plan(root, models=models or everything, store=store or everything)
    items, name = planned.items, planned.machine
    if dry_run or not items:
        if as_json:
            print_json({"machine": name, "dry_run": dry_run, "items": [i.to_json() for i in items]})
        else:
            _list(items, name, "would go" if items else "nothing of llmgw is here")
        return
    if not as_json:
        _list(items, name, "goes")
    if yes_i_mean != name:
        if yes_i_mean:
            raise LlmgwError(
                f"--yes-i-mean {yes_i_mean!r} is not this machine's name ({name!r})",
                hint="give this machine's own name: nothing was removed",
            )
        check_typed_name(typer.prompt(f"type this machine's name ({name}) to wipe llmgw from it"), name)
    failure: WipeFailed | None = None
    try:
        outcomes = run_wipe(planned)
    except WipeFailed as error:
        outcomes, failure = error.outcomes, error
    if as_json:
        print_json(
            {
                "machine": name,
                "dry_run": False,
                "items": [{**o.item.to_json(), "result": o.result, "ok": o.ok} for o in outcomes],
            }
        )
    else:
        table(["KIND", "WHAT", "RESULT"], [(o.item.kind, o.item.what, o.result) for o in outcomes])
    if failure is not None:
        raise failure


def _list(items: list[Any], name: str, verb: str) -> None:
    table(["KIND", "WHAT", "DETAIL"], [(i.kind, i.what, i.detail) for i in items], title=f"{name}: {verb}")
    if not items:
        console.print(f"{name}: nothing of llmgw is here")
