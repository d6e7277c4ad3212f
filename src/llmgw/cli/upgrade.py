"""``llmgw upgrade``: install a signed release on this machine, and say what to restart.

Also ``ctl upgrade agents|status``. The releases' modules (their download
client, the signature's cryptography) are imported where a release is read,
so ``ctl`` does without them.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import typer
import yaml

from llmgw import __version__
from llmgw.adminapi.upgrades import RolloutView
from llmgw.cli.mirror import upload
from llmgw.cli.options import TOKEN, URL, client
from llmgw.cli.output import console
from llmgw.client.paths import find_server_config
from llmgw.errors import ConfigError, UntrustedRelease

FOLLOW_S = 2.0
"""How often a followed rollout is asked where it stands."""


def trusted_key_path(config: Path) -> Path:
    """``release.trusted_pub`` of a server.yaml or agent.yaml (relative: to its directory)."""
    from llmgw.mirror.releases import ReleaseSettings

    try:
        data: Any = yaml.safe_load(config.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read {config}: {error}", hint="give server.yaml or agent.yaml") from error
    section = data.get("release") if isinstance(data, dict) else None
    value = ReleaseSettings.model_validate(section or {}).trusted_pub
    path = Path(value).expanduser()
    return path if path.is_absolute() else config.parent / path


def upgrade(
    source: str = typer.Option(
        "dist/release", "--from", help="The release: a directory, or an https address serving it."
    ),
    config: Path | None = typer.Option(
        None, "--config", help="server.yaml or agent.yaml whose release.trusted_pub is trusted."
    ),
    trusted_pub: Path | None = typer.Option(
        None, "--trusted-pub", help="The release key's public half (instead of the config's)."
    ),
) -> None:
    """Verify a signed release, then install it into the environment llmgw runs from.

    The release must be signed by the trusted key; an unsigned, badly signed or
    altered one is refused before anything is installed.
    """
    from llmgw.mirror.releases import read_trusted_key
    from llmgw.mirror.upgrades import PipInstaller
    from llmgw.mirror.upgrades import upgrade as run_upgrade

    key_path = trusted_pub
    if key_path is None:
        found = config or find_server_config()
        if found is None:
            raise ConfigError(
                "no trusted release key: no server.yaml found and none given",
                hint="pass --config agent.yaml (or server.yaml) or --trusted-pub PATH",
            )
        key_path = trusted_key_path(found)
    key = read_trusted_key(key_path)
    with tempfile.TemporaryDirectory(prefix="llmgw-upgrade-") as work:
        release = asyncio.run(run_upgrade(source, Path(work), key, PipInstaller()))
    if release is None:
        console.print(f"llmgw {__version__} already runs here; nothing to install")
        return
    console.print(f"installed llmgw {release.version} (was {__version__}), verified against {key_path}")
    console.print(
        "restart llmgw's processes on this machine to run it: 'llmgw server run' and 'llmgw agent run' "
        "(or their services); agents elsewhere: 'llmgw ctl upgrade agents --release ...'"
    )


upgrade_app = typer.Typer(
    help="Upgrade the agents to a signed release, one node at a time.", no_args_is_help=True
)


def _show(rollout: RolloutView) -> None:
    state = (
        "finished" if rollout.finished else f"upgrading {rollout.current}" if rollout.current else "starting"
    )
    console.print(
        f"llmgw {rollout.version}: {len(rollout.upgraded)} of {len(rollout.nodes)} nodes upgraded ({state})"
    )
    if rollout.error:
        console.print(f"[bold red]stopped:[/] {rollout.error}", highlight=False)


@upgrade_app.command("agents")
def upgrade_agents(
    release: Path = typer.Option(..., "--release", help="The signed release directory ('make release')."),
    node: list[str] | None = typer.Option(
        None, "--node", help="A node to upgrade, in order (repeat); none: all."
    ),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Follow the rollout until it ends."),
    url: str | None = URL,
    token: str | None = TOKEN,
) -> None:
    """Put the release into the mirror, then upgrade the agents one node at a time.

    The leader checks the release against its trusted key, and each agent
    against its own before installing; the next node starts only once this one
    has registered again with the new version. Engines keep serving.
    """
    from llmgw.mirror.releases import SIGNATURE, SUMS, parse_sums

    sums = (release / SUMS).read_text() if (release / SUMS).is_file() else ""
    if not sums or not (release / SIGNATURE).is_file():
        raise UntrustedRelease(
            f"{release} holds no {SUMS} and {SIGNATURE}: it is not a signed release",
            hint="make one with 'make release KEY=...'",
        )
    admin = client(url, token)
    for name in sorted(parse_sums(sums.encode(), str(release / SUMS))):
        upload(admin, release / name)
    body = {"sums": sums, "signature": (release / SIGNATURE).read_text(), "nodes": node or None}
    rollout = RolloutView.model_validate(admin.request("POST", "/api/upgrades/agents", body))
    _show(rollout)
    while wait and not rollout.finished:
        time.sleep(FOLLOW_S)
        rollout = RolloutView.model_validate(admin.request("GET", "/api/upgrades/agents"))
    if wait:
        _show(rollout)
    if rollout.error:
        raise typer.Exit(1)


@upgrade_app.command("status")
def upgrade_status(url: str | None = URL, token: str | None = TOKEN) -> None:
    """Where the last upgrade of the agents stands, or why it stopped."""
    _show(RolloutView.model_validate(client(url, token).request("GET", "/api/upgrades/agents")))
