"""Where the commands look for configuration when not told."""

from __future__ import annotations

import os
from pathlib import Path

SYSTEM_DIR = Path("/etc/llmgw")


def up_home() -> Path:
    """The data directory of ``llmgw up``: ``$LLMGW_HOME`` or ``~/.local/share/llmgw/up``."""
    if os.environ.get("LLMGW_HOME"):
        return Path(os.environ["LLMGW_HOME"]).expanduser()
    base = Path(os.environ.get("XDG_DATA_HOME", "~/.local/share")).expanduser()
    return base / "llmgw" / "up"


def server_config_candidates() -> list[Path]:
    """server.yaml files tried in order: ``$LLMGW_CONFIG``, the ``up`` home, /etc/llmgw."""
    out = []
    if os.environ.get("LLMGW_CONFIG"):
        out.append(Path(os.environ["LLMGW_CONFIG"]).expanduser())
    out.append(up_home() / "server.yaml")
    out.append(SYSTEM_DIR / "server.yaml")
    return out


def find_server_config() -> Path | None:
    for candidate in server_config_candidates():
        if candidate.exists():
            return candidate
    return None
