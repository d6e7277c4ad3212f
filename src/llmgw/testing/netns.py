"""Machines on one switch, as network namespaces on this one (``ip netns``; root only).

:class:`Machines` makes ``count`` namespaces, each a machine with its
loopback and one port (``lan0``) on a switch: a namespace of its own holding a
bridge. Machine ``i`` is at ``198.18.231.<i+1>`` (RFC 2544's benchmarking
range, never routed). With ``outside=True`` a veth pair joins this (the test's)
namespace to machine 0 on a ``198.19.N.0/30`` of its own (``N`` the first not in
use here): the test reaches a server machine 0 runs on
:attr:`Machines.outside_address`, and nothing else of any machine. Everything
is named after ``tag`` and removed by those names (:meth:`Machines.remove`),
so concurrent runs with other tags do not meet.

A machine can lose its link (:meth:`Machines.link`) or every process it runs
(:meth:`Machines.kill_all`: SIGKILL, as a machine losing power leaves no
process to say goodbye).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

SUBNET = "198.18.231"
"""The machines' switch (RFC 2544's benchmarking range)."""
OUTSIDE_RANGE = "198.19"
"""Where the link from the test's namespace to machine 0 takes a /30."""
LINK = "lan0"
"""A machine's port on the switch (a name inside its namespace)."""


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
class Machines:
    tag: str
    """Short (the test's side of its link is named ``lg<tag>``: at most 13 characters)."""
    count: int = 2
    outside: bool = False
    names: list[str] = field(init=False)
    addresses: list[str] = field(init=False)
    outside_address: str = ""
    """Machine 0's address on the test's link (with ``outside``)."""

    def __post_init__(self) -> None:
        self.names = [f"llmgw-{self.tag}-{index}" for index in range(self.count)]
        self.addresses = [f"{SUBNET}.{index + 1}" for index in range(self.count)]
        self._switch = f"llmgw-{self.tag}-sw"
        self._outside_link = f"lg{self.tag}"

    def make(self) -> None:
        self.remove()
        _ip("netns", "add", self._switch)
        _ip("-n", self._switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self._switch, "link", "set", "br0", "up")
        for index, (name, address) in enumerate(zip(self.names, self.addresses, strict=True)):
            port = f"p{index}"
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "link", "add", LINK, "type", "veth", "peer", "name", port, "netns", self._switch)
            _ip("-n", self._switch, "link", "set", port, "master", "br0")
            _ip("-n", self._switch, "link", "set", port, "up")
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", LINK)
            _ip("-n", name, "link", "set", LINK, "up")
        if self.outside:
            subnet = _free_outside_subnet()
            self.outside_address = f"{subnet}.1"
            _ip(
                "link",
                "add",
                self._outside_link,
                "type",
                "veth",
                "peer",
                "name",
                "up0",
                "netns",
                self.names[0],
            )
            _ip("addr", "add", f"{subnet}.2/30", "dev", self._outside_link)
            _ip("link", "set", self._outside_link, "up")
            _ip("-n", self.names[0], "addr", "add", f"{self.outside_address}/30", "dev", "up0")
            _ip("-n", self.names[0], "link", "set", "up0", "up")

    def remove(self) -> None:
        """End what runs on the machines, then remove them, the switch and the test's link."""
        present = _ip("netns", "list", check=False).split()
        for index, name in enumerate(self.names):
            if name in present:
                self.kill_all(index)
                _ip("netns", "del", name, check=False)
        if self._switch in present:
            _ip("netns", "del", self._switch, check=False)
        _ip("link", "del", self._outside_link, check=False)

    def argv(self, index: int, *argv: str) -> list[str]:
        """``argv`` run on machine ``index`` (``ip netns exec`` execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", self.names[index], *argv]

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
        """Machine ``index``'s port up or down (down: it hears and says nothing)."""
        _ip("-n", self.names[index], "link", "set", LINK, "up" if up else "down")
