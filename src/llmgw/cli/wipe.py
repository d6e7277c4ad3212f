"""``llmgw wipe``: take llmgw off this machine, after listing what goes and asking its name (C10.3)."""

from __future__ import annotations

import functools
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import yaml

from llmgw.agent.shardstates import STATE_FILE, CorruptState, is_engine, read_state
from llmgw.cli.output import console, print_json, table
from llmgw.errors import LlmgwError
from llmgw.operations.nftables import Nft
from llmgw.operations.wiping import EngineProcess, Item, Layout, Machine, Outcome, plan, run_command, wipe

CONFIG_DIR = "etc/llmgw"


def _yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _under(root: Path, base: Path, value: str) -> Path:
    """``value`` of a configuration file in ``base``: relative to it, ``~`` as root's home, under ``root``."""
    if value == "~" or value.startswith("~/"):
        return root / "root" / value[2:]
    path = Path(value)
    return root / path.relative_to("/") if path.is_absolute() else base / path


def layout_of(root: Path) -> Layout:
    """Where llmgw lives under ``root``, read from its server.yaml and agent.yaml where present."""
    config_dir = root / CONFIG_DIR
    server = _yaml(config_dir / "server.yaml")
    agent = _yaml(config_dir / "agent.yaml")
    data_dir = _under(root, config_dir, str(server.get("data_dir", "/var/lib/llmgw")))
    work_dir = _under(root, config_dir, str(agent.get("work_dir", "work")))
    cache_dir = _under(root, config_dir, str(agent.get("cache_dir", "~/.cache/llmgw")))
    return Layout(
        root, config_dir, data_dir, work_dir, (cache_dir, root / "opt/llmgw"), live=root == Path("/")
    )


def running_engines(work_dir: Path) -> list[EngineProcess]:
    """The engines the shards' state files name that are still running (same pid, start, command)."""
    engines = []
    for state in sorted((work_dir / "shards").glob(f"*/{STATE_FILE}")):
        try:
            record = read_state(state.parent)
        except CorruptState:
            continue
        if is_engine(record):
            engines.append(
                EngineProcess(record.pid, record.spec.replica_id, functools.partial(is_engine, record))
            )
    return engines


def machine_name(root: Path) -> str:
    try:
        name = (root / "etc/hostname").read_text().strip()
    except OSError:
        name = ""
    return name or socket.gethostname()


@dataclass(frozen=True)
class WipePlan:
    """What goes from the machine under ``layout.root``, and the name that must be typed first."""

    layout: Layout
    engines: list[EngineProcess]
    items: list[Item]
    machine: str


def wipe_plan(root: Path, *, models: bool, store: bool) -> WipePlan:
    """What wiping ``root`` takes away (``models``, ``store``: those too)."""
    layout = layout_of(root)
    engines = running_engines(layout.work_dir)
    nft_table = layout.live and bool(Nft().table())
    items = plan(layout, engines, models=models, store=store, nft_table=nft_table)
    return WipePlan(layout, engines, items, machine_name(root))


def check_typed_name(typed: str, name: str) -> None:
    """The machine's name typed at the question; anything else removes nothing."""
    if typed.strip() != name:
        raise LlmgwError(f"{typed!r} is not {name!r}: nothing was removed", hint="run it again")


def run_wipe(planned: WipePlan) -> list[Outcome]:
    """Remove what ``planned`` lists; the outcomes, or LlmgwError naming the items that stayed."""
    outcomes = wipe(planned.items, planned.layout, planned.engines, Machine(run_command))
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise WipeFailed(outcomes, failed)
    return outcomes


class WipeFailed(LlmgwError):
    """Some items stayed; ``outcomes`` says what happened to each."""

    def __init__(self, outcomes: list[Outcome], failed: list[Outcome]) -> None:
        super().__init__(
            f"{len(failed)} of {len(outcomes)} items were not removed: "
            + "; ".join(f"{o.item.what}: {o.result}" for o in failed),
            hint="fix what is named (run as root?) and run llmgw wipe again: what went is not listed again",
        )
        self.outcomes = outcomes


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
