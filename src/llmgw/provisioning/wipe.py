"""Wiping llmgw off this machine (``llmgw wipe``, the console's Wipe): what goes, then taking it away.

:func:`wipe_plan` reads where llmgw lives under a root (its server.yaml and
agent.yaml), the engines still running there and whether the nft table is
loaded, and lists what goes (:mod:`llmgw.operations.wiping` decides the
items); nothing is removed until the caller has had the machine's name typed
(:func:`check_typed_name`) and calls :func:`run_wipe`, which raises
:class:`WipeFailed` naming what stayed. The caller shows the list and the
outcomes.
"""

from __future__ import annotations

import functools
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llmgw.agent.shardstates import STATE_FILE, CorruptState, is_engine, read_state
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
