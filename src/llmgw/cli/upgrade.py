"""``llmgw upgrade``: install a signed release on this machine, and say what to restart."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import typer
import yaml

from llmgw import __version__
from llmgw.cli.output import console
from llmgw.cli.paths import find_server_config
from llmgw.errors import ConfigError
from llmgw.mirror.releases import ReleaseSettings, read_trusted_key
from llmgw.mirror.upgrades import PipInstaller
from llmgw.mirror.upgrades import upgrade as run_upgrade


def trusted_key_path(config: Path) -> Path:
    """``release.trusted_pub`` of a server.yaml or agent.yaml (relative: to its directory)."""
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
