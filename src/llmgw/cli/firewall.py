"""``llmgw firewall sync|show``: llmgw's nftables table on this machine (C10.2).

The control plane and the agent each write their part (their ports and who
may reach them) under ``/run/llmgw/firewall`` and apply the table themselves
when they run as root; ``sync`` applies what they wrote (as root: nft needs
CAP_NET_ADMIN), ``show`` prints the parts, the table they make and the table
the kernel holds.
"""

from __future__ import annotations

from pathlib import Path

import typer

from llmgw.cli.output import console, print_json, table
from llmgw.operations.firewall import render_table
from llmgw.operations.nftables import STATE_DIR, FirewallState, Nft, sync

app = typer.Typer(help="llmgw's nftables table on this machine.", no_args_is_help=True)

STATE_OPTION = typer.Option(STATE_DIR, "--state-dir", help="Where llmgw's processes write their parts.")


@app.command("sync")
def sync_command(
    state_dir: Path = STATE_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Apply llmgw's table from the parts this machine's processes wrote (in one nft transaction)."""
    result = sync(FirewallState(state_dir), Nft())
    if as_json:
        print_json(
            {
                "applied": bool(result.table),
                "table": result.table,
                "parts": [p.to_json() for p in result.parts],
            }
        )
        return
    if result.table:
        rules = sum(len(p.rules) for p in result.parts if p.enabled)
        console.print(f"table inet llmgw applied: {rules} rules from {len(result.parts)} parts")
    else:
        console.print("table inet llmgw removed (or never there): no enabled part has a rule")


@app.command("show")
def show_command(
    state_dir: Path = STATE_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the parts and tables as JSON."),
) -> None:
    """Print each process's part, the table they make, and the table the kernel holds now."""
    nft = Nft()
    parts = FirewallState(state_dir).parts()
    wanted = render_table(parts)
    live = nft.table()
    if as_json:
        print_json(
            {
                "parts": [p.to_json() for p in parts],
                "wanted": wanted,
                "live": live,
                "nft_installed": nft.available(),
            }
        )
        return
    rows = [
        (
            part.name,
            "on" if part.enabled else "off",
            rule.ports(),
            ", ".join(rule.sources) or _nobody(rule.anywhere),
        )
        for part in parts
        for rule in part.rules
    ]
    table(["PART", "FIREWALL", "PORTS", "FROM"], rows, title=f"parts in {state_dir}")
    console.print("[bold]wanted[/]\n" + (wanted or "(no table)"), markup=True, highlight=False)
    if not nft.available():
        console.print("nft is not installed: nothing is applied (apt-get install nftables)")
    else:
        console.print("[bold]live[/]\n" + (live or "(no table inet llmgw)"), markup=True, highlight=False)


def _nobody(anywhere: bool) -> str:
    return "anywhere" if anywhere else "loopback only"
