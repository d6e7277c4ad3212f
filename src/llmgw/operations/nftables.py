"""Applying llmgw's table with ``nft``, from the parts each process left in the state directory.

Each process writes its :class:`~llmgw.operations.firewall.FirewallPart` as
``<state dir>/<name>.json``; :func:`sync` reads every part, renders the table
and applies it with ``nft -f -`` in one transaction, under a lock, so two
processes of one machine (a control plane and an agent) never undo each
other's rules. ``llmgw firewall sync`` runs the same function as root.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmgw.errors import LlmgwError
from llmgw.operations.firewall import TABLE, FirewallPart, render_table, ruleset_file
from llmgw.runtime.files import write_public

STATE_DIR = Path("/run/llmgw/firewall")
"""Where the parts live: under /run, as the table itself does not outlive a reboot."""


class FirewallError(LlmgwError):
    """nft is missing or refused llmgw's table."""


@dataclass(frozen=True, slots=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], str], Completed]
"""Runs a command with this text on its standard input: the seam between llmgw and ``nft``."""


def run_command(argv: Sequence[str], stdin: str) -> Completed:
    done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=30, check=False)
    return Completed(done.returncode, done.stdout, done.stderr)


class Nft:
    """The ``nft`` program (or ``program``: a prefix such as ``ip netns exec NAME nft``)."""

    def __init__(
        self,
        program: Sequence[str] = ("nft",),
        runner: Runner = run_command,
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        self.program = tuple(program)
        self._run = runner
        self._which = which

    def available(self) -> bool:
        return self._which(self.program[0]) is not None

    def apply(self, text: str) -> None:
        """Apply ``text`` with ``nft -f -``, all of it or none; FirewallError naming nft's complaint."""
        if not self.available():
            raise FirewallError(
                f"'{self.program[0]}' is not installed, so llmgw's firewall cannot be applied",
                hint="install nftables (apt-get install nftables), or set firewall.enabled to false",
            )
        done = self._run([*self.program, "-f", "-"], text)
        if done.returncode != 0:
            raise FirewallError(
                f"nft refused llmgw's table: {done.stderr.strip() or done.stdout.strip()}",
                hint="run 'llmgw firewall sync' as root (nft needs CAP_NET_ADMIN); see docs/operations.md",
            )

    def table(self) -> str:
        """The table as the kernel holds it now; empty when there is none."""
        if not self.available():
            return ""
        done = self._run([*self.program, "list", "table", *TABLE.split()], "")
        return done.stdout if done.returncode == 0 else ""


class FirewallState:
    """The parts in the state directory."""

    def __init__(self, directory: Path = STATE_DIR) -> None:
        self.directory = directory

    def write(self, part: FirewallPart) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps(part.to_json(), indent=2, sort_keys=True) + "\n"
        # 0644: the root agent's part is read by the control plane's user, and nothing in it is secret
        write_public(self.directory / f"{part.name}.json", text.encode())

    def has(self, name: str) -> bool:
        return (self.directory / f"{name}.json").exists()

    def remove(self, name: str) -> None:
        (self.directory / f"{name}.json").unlink(missing_ok=True)

    def parts(self) -> list[FirewallPart]:
        """Every part written, by name; an unreadable file is an error naming it."""
        if not self.directory.is_dir():
            return []
        parts = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                parts.append(FirewallPart.from_json(json.loads(path.read_text())))
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise FirewallError(
                    f"{path} is not a firewall part: {error}",
                    hint="remove it; its process writes it again within a minute",
                ) from None
        return parts


@dataclass(frozen=True, slots=True)
class SyncResult:
    parts: list[FirewallPart]
    table: str
    """The table applied ("" when it was removed)."""


def sync(state: FirewallState, nft: Nft) -> SyncResult:
    """Apply the table of every part in ``state``, under the directory's lock."""
    try:
        state.directory.mkdir(parents=True, exist_ok=True)
        # read-only, so a lock file another user made (root's agent, llmgw's server) still locks
        lock = os.open(state.directory / ".lock", os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError as error:
        raise FirewallError(
            f"cannot use {state.directory}: {error}", hint="run as root, or as the llmgw service's user"
        ) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        parts = state.parts()
        table = render_table(parts)
        if table or nft.table():  # no table wanted and none there: nft is not asked to change anything
            nft.apply(ruleset_file(parts))
        return SyncResult(parts, table)
    finally:
        os.close(lock)
