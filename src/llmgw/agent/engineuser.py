"""The user engines run as when the agent runs as root (C2.5).

The agent drops engines to ``run_as`` (default ``llmgw-engine``): its uid,
gid and supplementary groups, with a 0700 home under the work directory as
working directory and HOME and XDG_CACHE_HOME there. A node without that
user runs engines as root, and says why once.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineUser:
    """Who engines run as, and where they live."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    """Supplementary groups (video, render: the cards' device files)."""
    home: Path
    """A 0700 directory under the work directory: the engines' working directory."""

    def spawn_options(self) -> dict[str, Any]:
        """What ``asyncio.create_subprocess_exec`` takes to start a process as this user.

        The credentials are dropped in the child before it executes the engine
        (uvloop, the agent's event loop, takes no ``user=``/``group=``).
        """
        return {"preexec_fn": self.become, "cwd": self.home}

    def become(self) -> None:
        """Take this user's groups, gid and uid (in that order: the uid last, as it drops the right)."""
        os.setgroups(list(self.groups))
        os.setgid(self.gid)
        os.setuid(self.uid)

    def environment(self) -> dict[str, str]:
        return {"HOME": str(self.home), "XDG_CACHE_HOME": str(self.home / ".cache"), "USER": self.name}


@dataclass(frozen=True, slots=True)
class UserLookup:
    """The system's user database and this process's uid: a seam for tests."""

    euid: Callable[[], int] = os.geteuid
    user: Callable[[str], Any] = pwd.getpwnam
    groups: Callable[[str, int], list[int]] = os.getgrouplist
    chown: Callable[[Path, int, int], None] = os.chown


def engine_user(run_as: str, work_dir: Path, lookup: UserLookup | None = None) -> EngineUser | None:
    """The user engines run as; None when they run as the agent (logged once, saying why)."""
    lookup = lookup or UserLookup()
    if lookup.euid() != 0:
        return None
    if not run_as:
        log.info("engines run as root: run_as is empty in agent.yaml")
        return None
    try:
        entry = lookup.user(run_as)
    except KeyError:
        log.warning(
            "engines run as root: there is no user %r on this node; create it "
            "('useradd --system --groups video,render %s') and restart the agent, or set run_as",
            run_as,
            run_as,
        )
        return None
    home = work_dir / "home" / run_as
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    lookup.chown(home, entry.pw_uid, entry.pw_gid)
    groups = tuple(g for g in lookup.groups(run_as, entry.pw_gid) if g != entry.pw_gid)
    names = ", ".join(_group_name(g) for g in groups) or "none"
    log.info("engines run as %s (uid %d, groups %s) in %s", run_as, entry.pw_uid, names, home)
    return EngineUser(run_as, entry.pw_uid, entry.pw_gid, groups, home)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
