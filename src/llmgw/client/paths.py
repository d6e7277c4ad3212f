"""Where llmgw looks for its files on this machine when not told.

Each function takes the environment it reads (``os.environ`` unless given),
so a caller can say where to look without touching the process's own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from llmgw.errors import ConfigError

SYSTEM_DIR = Path("/etc/llmgw")


def _home(environ: Mapping[str, str]) -> Path:
    return Path(environ["HOME"]) if environ.get("HOME") else Path.home()


def _expand(value: str, environ: Mapping[str, str]) -> Path:
    if value == "~" or value.startswith("~/"):
        return _home(environ) / value[2:]
    return Path(value)


def up_home(environ: Mapping[str, str] = os.environ) -> Path:
    """The data directory of ``llmgw up``: ``$LLMGW_HOME`` or ``$XDG_DATA_HOME/llmgw/up``."""
    if environ.get("LLMGW_HOME"):
        return _expand(environ["LLMGW_HOME"], environ)
    base = _expand(environ.get("XDG_DATA_HOME") or "~/.local/share", environ)
    return base / "llmgw" / "up"


def server_config_candidates(environ: Mapping[str, str] = os.environ) -> list[Path]:
    """server.yaml files tried in order: ``$LLMGW_CONFIG``, the ``up`` home, /etc/llmgw."""
    out = []
    if environ.get("LLMGW_CONFIG"):
        out.append(_expand(environ["LLMGW_CONFIG"], environ))
    out.append(up_home(environ) / "server.yaml")
    out.append(SYSTEM_DIR / "server.yaml")
    return out


def find_server_config(environ: Mapping[str, str] = os.environ) -> Path | None:
    for candidate in server_config_candidates(environ):
        if candidate.exists():
            return candidate
    return None


def resolve_server_config(path: Path | None, environ: Mapping[str, str] = os.environ) -> Path:
    """``path`` when given, else the first server.yaml found (:func:`find_server_config`); ConfigError
    saying how to name or make one when there is none."""
    if path is not None:
        return path
    found = find_server_config(environ)
    if found is None:
        raise ConfigError(
            "no server.yaml found",
            "pass --config, set LLMGW_CONFIG, or create one with 'llmgw server init'",
        )
    return found


def client_config_path(environ: Mapping[str, str] = os.environ) -> Path:
    """The client config (contexts): ``$LLMGW_CLIENT_CONFIG`` or ``$XDG_CONFIG_HOME/llmgw/config.yaml``."""
    if environ.get("LLMGW_CLIENT_CONFIG"):
        return _expand(environ["LLMGW_CLIENT_CONFIG"], environ)
    base = _expand(environ.get("XDG_CONFIG_HOME") or "~/.config", environ)
    return base / "llmgw" / "config.yaml"


def engine_cache(environ: Mapping[str, str] = os.environ) -> Path:
    """Where engine builds are kept: ``$LLMGW_CACHE`` or ``~/.cache/llmgw`` (as the agent expands it)."""
    return Path(environ.get("LLMGW_CACHE", "~/.cache/llmgw"))
