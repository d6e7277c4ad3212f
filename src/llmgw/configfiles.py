"""Configuration files (server.yaml, agent.yaml): read, checked field by field, written atomically.

Relative paths in a file are taken from the file's own directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from llmgw.core.catalog import problems_of
from llmgw.errors import ConfigError
from llmgw.runtime.files import PRIVATE_MODE, write_atomically


class Section(BaseModel):
    """A group of settings; unknown keys are refused, so a misspelt one never goes unnoticed."""

    model_config = ConfigDict(extra="forbid")


class ConfigFile(Section):
    """A whole file's settings, knowing the directory it was read from."""

    _directory: Path = Path(".")

    def path(self, value: str) -> Path:
        """A path from the file, relative ones taken from the file's directory."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else self._directory / p

    @property
    def directory(self) -> Path:
        return self._directory


C = TypeVar("C", bound=ConfigFile)


def read_yaml(path: Path, missing_hint: str) -> dict[str, Any]:
    """A YAML mapping from ``path``; ConfigError naming the file when missing, unreadable or no mapping."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"no configuration at {path}", missing_hint) from None
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read {path}: {error}", "fix the file") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a mapping of settings", "fix the file")
    return data


def validate(kind: type[C], data: dict[str, Any], where: str, directory: Path | None = None) -> C:
    """``data`` as ``kind``, or ConfigError naming ``where`` and every bad field."""
    try:
        config = kind.model_validate(data)
    except ValidationError as error:
        text = "; ".join(f"{field}: {why}" for field, why in problems_of(error))
        raise ConfigError(f"{where}: {text}", "fix the fields named") from None
    if directory is not None:
        config._directory = directory.resolve()
    return config


def save(config: ConfigFile, path: Path) -> None:
    """Write ``config`` to ``path`` atomically, 0600: a crash leaves the old file or the new, never half."""
    text = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    write_atomically(path, text.encode(), mode=PRIVATE_MODE)  # server.yaml holds the store's password
    config._directory = path.parent.resolve()
