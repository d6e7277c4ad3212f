"""Settings on trial: an agent that cannot start on new settings goes back to the last good ones.

Settings from the control plane (C2.4) are kept in ``settings.yaml`` beside
agent.yaml, and the agent starts again on them. Settings that validate can
still stop it from starting (a work directory it cannot create), and an agent
that crash-loops never connects to be sent the fix. So new settings are on
trial until the agent has started and registered with them:

- ``settings.good.yaml``: the settings the agent last registered with.
- ``settings.trying``: written when an agent starts on settings that are not
  the good ones; removed once it registers (they become the good ones) or
  when it stops on its own before registering. The next start finding it
  means the last one ended on them without registering: crashed or killed.
- ``settings.refused.yaml``: settings the agent went back from, and why. The
  agent reports them in each registration (``ctl status``, ``ctl nodes``) and
  declines them when the control plane sends them again, until it sends others.

Each file is written atomically, so the fallback holds across the agent's own
restart (it re-executes itself) and across a crash.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from llmgw.agent.config import keep_settings, kept_settings, settings_path
from llmgw.core.nodes import SettingsRefusal, flat_settings

log = logging.getLogger(__name__)

GOOD_FILE = "settings.good.yaml"
TRYING_FILE = "settings.trying"
REFUSED_FILE = "settings.refused.yaml"

CRASHED = "the agent ended on them before it registered (it crashed or was killed): see its log"


class SettingsTrial:
    """The fallback files beside agent.yaml at ``config_path``."""

    def __init__(self, config_path: Path, clock: Callable[[], float] = time.time) -> None:
        self._path = config_path
        self._clock = clock
        self.trying = False
        """This process started on settings that are not yet the good ones."""
        self.registered = False

    def _file(self, name: str) -> Path:
        return self._path.parent / name

    # at start ----------------------------------------------------------------
    def begin(self) -> SettingsRefusal | None:
        """Before the agent loads its settings: go back if the last start on them never registered.

        Returns the refusal made now, if any.
        """
        current = kept_settings(self._path)
        trying = self._file(TRYING_FILE)
        if trying.exists():
            reason = trying.read_text(errors="replace").strip() or CRASHED
            return self._go_back(current, reason)
        if current != self.good():
            self.trying = True
            _write(trying, "")
            log.info("starting on new settings; the last good ones are kept in %s", GOOD_FILE)
        return None

    def fail(self, error: BaseException) -> SettingsRefusal | None:
        """The agent could not start on the settings on trial: back to the good ones (None: none on trial)."""
        if not self.trying or self.registered:
            return None
        return self._go_back(kept_settings(self._path), describe(error))

    def stopped(self) -> None:
        """The agent stops on its own (signal, restart) before registering: no verdict on the settings."""
        if self.trying and not self.registered:
            self._file(TRYING_FILE).unlink(missing_ok=True)

    def _go_back(self, refused: dict[str, Any], reason: str) -> SettingsRefusal:
        good = self.good()
        refusal = SettingsRefusal(
            settings=yaml.safe_dump(refused, sort_keys=True), reason=reason, refused_at=self._clock()
        )
        _write(
            self._file(REFUSED_FILE),
            yaml.safe_dump({"settings": refused, "reason": reason, "refused_at": refusal.refused_at}),
        )
        if good:
            keep_settings(self._path, good)
        else:
            settings_path(self._path).unlink(missing_ok=True)
        self._file(TRYING_FILE).unlink(missing_ok=True)
        self.trying = False
        log.error(
            "the agent could not start on the control plane's settings (%s): %s; back on the last good "
            "ones; fix them with 'llmgw ctl config set'",
            flat_settings(refused),
            reason,
        )
        return refusal

    # once registered -----------------------------------------------------------
    def on_registered(self) -> None:
        """The agent registered: the settings it runs on are the good ones from now on."""
        if self.registered:
            return
        self.registered = True
        good = self._file(GOOD_FILE)
        current = kept_settings(self._path)
        if self.trying or not good.exists():
            _write(good, yaml.safe_dump(current, sort_keys=True))
        if self.trying:
            log.info("the new settings work: kept as the last good ones")
            self.trying = False
        self._file(TRYING_FILE).unlink(missing_ok=True)

    # what the agent says ---------------------------------------------------------
    def good(self) -> dict[str, Any]:
        """The settings the agent last registered with (empty: agent.yaml alone, or none yet)."""
        data = _read(self._file(GOOD_FILE))
        return data if isinstance(data, dict) else {}

    def refusal(self) -> SettingsRefusal | None:
        """The settings the agent went back from, and why; None when it has gone back from none."""
        data = _read(self._file(REFUSED_FILE))
        if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
            return None
        return SettingsRefusal(
            settings=yaml.safe_dump(data["settings"], sort_keys=True),
            reason=str(data.get("reason", "")),
            refused_at=float(data.get("refused_at", 0.0)),
        )

    def refused(self) -> dict[str, Any] | None:
        """The refused settings as a mapping (to compare with those the control plane sends)."""
        refusal = self.refusal()
        return yaml.safe_load(refusal.settings) if refusal else None

    def withdraw(self) -> bool:
        """The control plane no longer asks for the refused settings: forget them; True if there were some."""
        path = self._file(REFUSED_FILE)
        if not path.exists():
            return False
        path.unlink()
        return True


def describe(error: BaseException) -> str:
    """An error as ``Type: message`` (an exception group by its first error)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    message = getattr(error, "message", "") or str(error)
    return f"{type(error).__name__}: {message}"


def _read(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def _write(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
