"""Taking llmgw off a machine: what goes, listed first, then removed (C10.3).

:func:`plan` lists every item (units, engines' processes, the nft table, the
configuration, the state, engine builds, the CA in the system trust store,
the keepalived configuration llmgw wrote, the sudo grant, the users) under a
root directory (``/`` on the machine itself, a scratch directory in tests);
the weights (``models``) and the store (``store``) go only when asked.
:func:`wipe` removes them in order: the units stop first (so nothing starts an
engine again), then each engine by the pid its state file recorded, checked to
still be that engine, then the rest. What acts on the running system (systemctl,
nft, update-ca-certificates) runs only when the root is ``/``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.operations.units import NOT_BOOTED, ROLES, UNIT_DIR, unit_name

CA_FILE = "usr/local/share/ca-certificates/llmgw-ca.crt"
"""Where the cluster's CA goes in Debian's system trust store (``update-ca-certificates``)."""
KEEPALIVED_FILE = "etc/keepalived/keepalived.conf"
KEEPALIVED_MARK = "# Written by 'llmgw server add --vip'"
"""The first line of the keepalived configuration llmgw writes: only such a file is removed."""
SUDO_FILE = "etc/sudoers.d/llmgw"
USERS = ("llmgw-engine", "llmgw")
"""The users llmgw makes: engines' (``run_as``) and the control plane's (``llmgw service install``)."""
STORE_FILES = ("llmgw.db", "llmgw.db-wal", "llmgw.db-shm")
STOP_GRACE_S = 10.0


@dataclass(frozen=True, slots=True)
class EngineProcess:
    """A running engine, from its shard's state file."""

    pid: int
    replica: str
    still_it: Callable[[], bool]
    """Whether the pid is still that engine (same start time and command line): never signal another."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where llmgw lives on this machine, every path under ``root``."""

    root: Path
    config_dir: Path
    data_dir: Path
    """The control plane's data directory: the SQLite store, the mirror's blobs."""
    work_dir: Path
    """The agent's work directory: shards' state, logs, weights."""
    cache_dirs: tuple[Path, ...] = ()
    """Engine builds."""
    live: bool = False
    """Whether the root is the machine's own: the running system (systemd, nft, the trust store) is
    acted on too."""

    def models(self) -> list[Path]:
        return [self.data_dir / "mirror", self.work_dir / "weights"]

    def store(self) -> list[Path]:
        return [self.data_dir / name for name in STORE_FILES]


@dataclass(frozen=True, slots=True)
class Item:
    """One thing that goes."""

    kind: str
    what: str
    """A path, a pid, a unit, a user, a table."""
    detail: str = ""
    keep: tuple[Path, ...] = field(default=(), compare=False)
    """Paths inside a directory item that stay (weights, the store, unless asked)."""

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "what": self.what, "detail": self.detail}


def _users(root: Path) -> list[str]:
    try:
        lines = (root / "etc/passwd").read_text().splitlines()
    except OSError:
        return []
    present = {line.split(":", 1)[0] for line in lines if line}
    return [user for user in USERS if user in present]


def _keepalived_is_ours(path: Path) -> bool:
    try:
        return path.read_text().startswith(KEEPALIVED_MARK)
    except OSError:
        return False


def plan(
    layout: Layout, engines: Sequence[EngineProcess], *, models: bool, store: bool, nft_table: bool
) -> list[Item]:
    """What goes, in the order it goes; ``nft_table``: whether the machine holds llmgw's table."""
    root = layout.root
    keep = tuple(([] if models else layout.models()) + ([] if store else layout.store()))
    items = [
        Item("unit", unit_name(role), str(root / UNIT_DIR / unit_name(role)))
        for role in ROLES
        if (root / UNIT_DIR / unit_name(role)).exists()
    ]
    items += [Item("engine", str(e.pid), f"replica {e.replica}") for e in engines]
    if nft_table:
        items.append(Item("firewall", "table inet llmgw"))
    directories = [
        ("configuration", layout.config_dir),
        ("state", layout.data_dir),
        ("state", layout.work_dir),
        ("state", root / "run/llmgw"),
    ] + [("builds", path) for path in layout.cache_dirs]
    seen: list[Path] = []
    for kind, path in directories:
        if path.exists() and not any(path.is_relative_to(other) for other in seen):
            kept = tuple(k for k in keep if k.is_relative_to(path) and k.exists())
            detail = "keeping " + ", ".join(str(k) for k in kept) if kept else ""
            items.append(Item(kind, str(path), detail, kept))
            seen.append(path)
    if models:
        items += [Item("models", str(p)) for p in layout.models() if p.exists() and not _covered(p, seen)]
    if store:
        items += [Item("store", str(p)) for p in layout.store() if p.exists() and not _covered(p, seen)]
    if (root / CA_FILE).exists():
        items.append(Item("ca", str(root / CA_FILE), "the cluster's CA in the system trust store"))
    if _keepalived_is_ours(root / KEEPALIVED_FILE):
        items.append(Item("keepalived", str(root / KEEPALIVED_FILE), "written by llmgw server add --vip"))
    if (root / SUDO_FILE).exists():
        items.append(Item("sudo", str(root / SUDO_FILE), "the sudo grant"))
    items += [Item("user", user) for user in _users(root)]
    return items


def _covered(path: Path, directories: Iterable[Path]) -> bool:
    return any(path.is_relative_to(d) for d in directories)


@dataclass(frozen=True, slots=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Machine:
    """What wiping does to the running system: commands and signals (a seam for tests)."""

    run: Callable[[Sequence[str]], Completed]
    kill: Callable[[int, int], None] = os.kill
    monotonic: Callable[[], float] = time.monotonic
    pause: Callable[[float], None] = time.sleep


def run_command(argv: Sequence[str]) -> Completed:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=False)
    except FileNotFoundError:
        return Completed(127, "", f"{argv[0]}: not found")
    return Completed(done.returncode, done.stdout, done.stderr)


def remove_path(path: Path, keep: Sequence[Path] = ()) -> None:
    """Remove ``path`` (a file, a link or a tree) but the paths in ``keep`` and the directories above them."""
    if any(path == k for k in keep):
        return
    if path.is_dir() and not path.is_symlink():
        if any(k.is_relative_to(path) for k in keep):
            for child in path.iterdir():
                remove_path(child, keep)
            return
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def stop_engine(engine: EngineProcess, machine: Machine, grace_s: float = STOP_GRACE_S) -> str:
    """SIGTERM, the grace, SIGKILL: each signal only while the pid is still that engine."""
    if not engine.still_it():
        return "already gone"
    machine.kill(engine.pid, signal.SIGTERM)
    deadline = machine.monotonic() + grace_s
    while machine.monotonic() < deadline:
        if not engine.still_it():
            return "stopped"
        machine.pause(0.1)
    if engine.still_it():
        machine.kill(engine.pid, signal.SIGKILL)
        return "killed after the grace"
    return "stopped"


@dataclass
class Outcome:
    item: Item
    result: str
    ok: bool = True


def wipe(
    items: Sequence[Item], layout: Layout, engines: Sequence[EngineProcess], machine: Machine
) -> list[Outcome]:
    """Remove ``items`` in order; each outcome says what was done (or why not)."""
    by_pid = {str(e.pid): e for e in engines}
    outcomes = []
    for item in items:
        try:
            result = _remove(item, layout, by_pid, machine)
            outcomes.append(Outcome(item, result, ok=not result.startswith("failed")))
        except OSError as error:
            outcomes.append(Outcome(item, f"failed: {error}", ok=False))
    return outcomes


def _command(machine: Machine, *argv: str) -> str:
    done = machine.run(argv)
    if done.returncode != 0:
        return f"failed: {' '.join(argv)}: {(done.stderr or done.stdout).strip() or done.returncode}"
    return "done"


def _remove(item: Item, layout: Layout, engines: dict[str, EngineProcess], machine: Machine) -> str:
    root = layout.root
    match item.kind:
        case "unit":
            said = "removed (not stopped: not the machine's root)"
            if layout.live:
                said = _command(machine, "systemctl", "disable", "--now", item.what)
                if any(marker in said for marker in NOT_BOOTED):
                    said = "removed (systemd is not running here: nothing to stop)"
                elif said == "done":
                    said = "stopped, disabled and removed"
            for wants in (root / UNIT_DIR).glob(f"*.wants/{item.what}"):
                wants.unlink()
            (root / UNIT_DIR / item.what).unlink(missing_ok=True)
            if layout.live:
                machine.run(["systemctl", "daemon-reload"])
            return said
        case "engine":
            return stop_engine(engines[item.what], machine)
        case "firewall":
            if not layout.live:
                return "not removed: the kernel's tables are not under the root"
            return _command(machine, "nft", "delete", "table", "inet", "llmgw")
        case "ca":
            Path(item.what).unlink(missing_ok=True)
            if not layout.live:
                return "removed (the trust store is refreshed on the machine only)"
            return _command(machine, "update-ca-certificates", "--fresh")
        case "user":
            if layout.live:
                return _command(machine, "userdel", item.what)
            return _command(machine, "userdel", "--prefix", str(root), item.what)
        case _:
            remove_path(Path(item.what), item.keep)
            return "removed" + (f", {item.detail}" if item.keep else "")
