"""Two machines on one link, as network namespaces on this one (``ip netns``; root only).

:class:`TwoMachines` makes two namespaces joined by a veth pair on
``198.18.231.0/24`` (RFC 2544's benchmarking range, never routed), the first
machine at ``.1`` and the second at ``.2``, each with its loopback. With
``outside=True`` a second veth pair joins this (the test's) namespace to the
first machine, on a ``198.19.N.0/30`` of its own (``N`` the first not in use
here): the test reaches a server the first machine runs on that address, and
nothing else of either machine. Everything is named after ``tag`` and removed
by those names (:meth:`TwoMachines.remove`), so concurrent runs with other tags
do not meet.

A machine can lose its link (:meth:`TwoMachines.link`) or every process it runs
(:meth:`TwoMachines.kill_all`: SIGKILL, as a machine losing power leaves no
process to say goodbye).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

SUBNET = "198.18.231"
"""The machines' link (RFC 2544's benchmarking range)."""
OUTSIDE_RANGE = "198.19"
"""Where the link from the test's namespace to the first machine takes a /30."""
LINK = "lan0"
"""The machines' side of their link (a name inside each namespace)."""


def usable() -> str:
    """Why namespaces cannot be made here, or "" where they can (root with ``ip``)."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces"
    if not shutil.which("ip"):
        return "needs iproute2's ip"
    return ""


def _ip(*argv: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _free_outside_subnet() -> str:
    taken = _ip("-o", "-4", "addr", "show")
    start = os.getpid() % 250
    for step in range(250):
        candidate = f"{OUTSIDE_RANGE}.{(start + step) % 250 + 1}"
        if f" {candidate}." not in taken:
            return candidate
    raise RuntimeError(f"no free /30 left in {OUTSIDE_RANGE}.0.0/16 for the test's link")


@dataclass
class TwoMachines:
    tag: str
    """Short (the root-side link is named ``lg<tag>``: at most 13 characters)."""
    outside: bool = False
    names: tuple[str, str] = field(init=False)
    addresses: tuple[str, str] = (f"{SUBNET}.1", f"{SUBNET}.2")
    outside_address: str = ""
    """The first machine's address on the test's link (with ``outside``)."""

    def __post_init__(self) -> None:
        self.names = (f"llmgw-{self.tag}-a", f"llmgw-{self.tag}-b")
        self._outside_link = f"lg{self.tag}"

    def make(self) -> None:
        self.remove()
        first, second = self.names
        for name in self.names:
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", first, "link", "add", LINK, "type", "veth", "peer", "name", LINK, "netns", second)
        for name, address in zip(self.names, self.addresses, strict=True):
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", LINK)
            _ip("-n", name, "link", "set", LINK, "up")
        if self.outside:
            subnet = _free_outside_subnet()
            self.outside_address = f"{subnet}.1"
            _ip("link", "add", self._outside_link, "type", "veth", "peer", "name", "up0", "netns", first)
            _ip("addr", "add", f"{subnet}.2/30", "dev", self._outside_link)
            _ip("link", "set", self._outside_link, "up")
            _ip("-n", first, "addr", "add", f"{self.outside_address}/30", "dev", "up0")
            _ip("-n", first, "link", "set", "up0", "up")

    def remove(self) -> None:
        """End what runs in the namespaces, then remove them (and the test's link with the first)."""
        for index, name in enumerate(self.names):
            if name in _ip("netns", "list", check=False).split():
                self.kill_all(index)
                _ip("netns", "del", name, check=False)
        _ip("link", "del", self._outside_link, check=False)

    def argv(self, index: int, *argv: str) -> list[str]:
        """``argv`` run on machine ``index`` (``ip netns exec`` execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", self.names[index], *argv]

    def run(self, index: int, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(index, *argv), capture_output=True, text=True, timeout=timeout, check=False
        )

    def pids(self, index: int) -> list[int]:
        """Every process machine ``index`` runs."""
        return [int(pid) for pid in _ip("netns", "pids", self.names[index], check=False).split()]

    def kill_all(self, index: int) -> list[int]:
        """SIGKILL every process of machine ``index``; the pids killed."""
        killed = []
        for pid in self.pids(index):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        return killed

    def link(self, index: int, up: bool) -> None:
        """Machine ``index``'s side of the machines' link up or down (down: it hears and says nothing)."""
        _ip("-n", self.names[index], "link", "set", LINK, "up" if up else "down")
