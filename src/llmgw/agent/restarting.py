"""When the agent starts again: settings from the control plane, an edited agent.yaml, RestartAgent.

Settings pushed by the control plane (C2.4) are checked beside agent.yaml
(merged over it and validated), kept in settings.yaml beside it, and the
agent starts again on them; settings equal to those it runs change nothing.
An edited agent.yaml that loads restarts the agent too; one that does not is
refused with the reason logged, and the agent keeps running on the old one.
RestartAgent (C2.6) restarts it as it is. Engines keep serving throughout:
the next agent adopts them (C2.2).

Settings the agent could not start on (:mod:`llmgw.agent.settingstrial`) are
declined when the control plane sends them again; once it sends others, the
refusal is withdrawn (and the agent registers again to say so, when the new
settings are those it runs on already).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from llmgw.agent.config import keep_settings, kept_settings, load_agent_config, settings_problems
from llmgw.agent.settingstrial import SettingsTrial
from llmgw.errors import ConfigError

log = logging.getLogger(__name__)

WATCH_S = 1.0
"""How often agent.yaml is looked at."""


class Restarting:
    """Decides when the agent starts again, and on what."""

    def __init__(
        self,
        config_path: Path,
        restart: Callable[[str], None],
        trial: SettingsTrial | None = None,
        on_withdrawn: Callable[[], None] = lambda: None,
    ) -> None:
        self._path = config_path
        self._restart = restart
        self._trial = trial
        self.on_withdrawn = on_withdrawn
        """Called when the refusal is withdrawn and the agent does not restart (it registers again)."""
        self._loaded = self._read_file()
        self._settings = kept_settings(config_path)
        self._refused = self._loaded
        self.reason = ""
        """Why the agent is starting again; empty while it is not."""

    def _read_file(self) -> bytes:
        try:
            return self._path.read_bytes()
        except OSError:
            return b""

    def request(self, reason: str) -> None:
        if not self.reason:
            self.reason = reason
            log.warning("restarting the agent: %s; engines keep serving", reason)
            self._restart(reason)

    def on_settings(self, text: str) -> None:
        """The control plane's settings for this node: keep them and restart, refuse them, or nothing."""
        try:
            settings: Any = yaml.safe_load(text) or {}
        except yaml.YAMLError as error:
            log.error("refused the control plane's settings: not YAML: %s", error)
            return
        problems = settings_problems(settings)
        if problems:
            text = "; ".join(f"{field}: {why}" for field, why in problems)
            log.error("refused the control plane's settings: %s; fix them with 'llmgw ctl config set'", text)
            return
        if self._declined(settings):
            return
        if settings == self._settings:
            log.info("the control plane's settings are those the agent runs on")
            return
        try:
            load_agent_config(self._path, settings)
        except ConfigError as error:
            log.error("refused the control plane's settings: %s", error.message)
            return
        keep_settings(self._path, settings)
        self._settings = settings
        self.request("the control plane's settings changed")

    def _declined(self, settings: dict[str, Any]) -> bool:
        """True for settings the agent could not start on; other settings withdraw that refusal."""
        if self._trial is None:
            return False
        refusal = self._trial.refusal()
        if refusal is None:
            return False
        if settings == self._trial.refused():
            log.error(
                "declined the control plane's settings: the agent could not start on them (%s) and runs on "
                "its last good ones; fix them with 'llmgw ctl config set'",
                refusal.reason,
            )
            return True
        self._trial.withdraw()
        log.info("the control plane sent other settings than those refused: the refusal is withdrawn")
        if settings == self._settings:
            self.on_withdrawn()
        return False

    def check_file(self) -> None:
        """Restart on an edited agent.yaml that loads; refuse (once, logged) one that does not."""
        now = self._read_file()
        if now == self._loaded or now == self._refused:
            return
        try:
            load_agent_config(self._path)
        except ConfigError as error:
            self._refused = now
            log.error(
                "refused the edited agent.yaml: %s; running on the one loaded before (%s)",
                error.message,
                error.hint,
            )
            return
        self.request(f"{self._path} changed")

    async def watch_file(self) -> None:
        while not self.reason:
            self.check_file()
            await asyncio.sleep(WATCH_S)


def command_line() -> list[str]:
    """This process's own command line, as it was started (``python -m ...`` included)."""
    try:
        raw = Path("/proc/self/cmdline").read_bytes()
    except OSError:
        return [sys.executable, *sys.argv]
    return [part.decode() for part in raw.split(b"\0")[:-1]]


def start_again(argv: list[str]) -> None:
    """Replace this process with the same command (same pid: engines stay its children)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)
