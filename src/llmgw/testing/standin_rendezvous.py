"""How the stand-ins of a multi-node replica's shards really find each other, over TCP.

The head listens on the rendezvous port; every other shard connects and says
``join W`` (W: what it brings: 1 node for SGLang, its cards for Ray) and keeps
the connection open for as long as it runs. A process that must wait for the
whole cluster says ``wait N`` and is answered ``ok`` once the head and its
members bring N between them; its connection is closed the moment they bring
less again. So:

- the head serves ``/health`` only once every rank has connected
  (:meth:`Cluster.wait_for`, or ``wait N`` from vLLM's stand-in to the Ray head);
- a member whose head goes away sees its connection end and exits
  (:func:`join`), as a rank whose NCCL or Ray peer is gone does;
- a head whose member goes away learns it (``on_short``) and exits too.

Threads and plain sockets: the stand-ins' HTTP servers keep their own loops.

Over a real Ray cluster instead (:data:`REAL_RAY`, the end-to-end tests with
Ray itself), vLLM's stand-in asks that cluster what it holds, by Ray's own
``ray status --address`` (:func:`wait_real_ray`), as vLLM's placement group
waits for its cards: it serves once the cluster's GPUs reach tp x pp and exits
once they fall short again (Ray marks a node whose raylet is gone dead after
its health checks fail: about 25 s for a node killed outright, over a minute
for one whose link is cut).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

JOIN_WAIT_S = float(os.environ.get("LLMGW_STANDIN_JOIN_WAIT_S", "60"))
"""How long a member keeps trying to reach its head before it gives up (exit 1)."""
REAL_RAY = "LLMGW_STANDIN_RAY"
"""The environment variable naming a real ``ray`` program: vLLM's stand-in then waits on the real
cluster at ``RAY_ADDRESS`` (:func:`wait_real_ray`) rather than on :mod:`llmgw.testing.ray_standin`'s."""
RAY_STATUS_EVERY_S = 2.0
"""How often vLLM's stand-in asks a real Ray cluster what it holds (each ``ray status`` costs ~0.5 s
of a core)."""
RAY_STATUS_FAILURES = 3
"""``ray status`` failing this many times in a row (its head is gone) counts as the cluster lost."""
_TOTAL_GPUS = re.compile(r"^\s*[\d.]+/(?P<total>[\d.]+) GPU\s*$", re.MULTILINE)


class Cluster:
    """The head's side: who has joined, and what they bring."""

    def __init__(self, port: int, own: int, host: str = "") -> None:
        self.own = own
        self._members: dict[socket.socket, int] = {}
        self._waiters: list[tuple[socket.socket, int]] = []
        self._changed = threading.Condition()
        self._listener = socket.create_server((host, port), reuse_port=False)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def total(self) -> int:
        with self._changed:
            return self.own + sum(self._members.values())

    def wait_for(self, needed: int, on_short: Callable[[], None]) -> None:
        """Block until the cluster brings ``needed``; then call ``on_short`` (once) when it brings less."""
        with self._changed:
            self._changed.wait_for(lambda: self.own + sum(self._members.values()) >= needed)

        def watch() -> None:
            with self._changed:
                self._changed.wait_for(lambda: self.own + sum(self._members.values()) < needed)
            on_short()

        threading.Thread(target=watch, daemon=True).start()

    def _accept(self) -> None:
        while True:
            connection, _ = self._listener.accept()
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        reader = connection.makefile("r")
        words = reader.readline().split()
        if len(words) != 2 or words[0] not in ("join", "wait") or not words[1].isdigit():
            connection.close()
            return
        amount = int(words[1])
        if words[0] == "join":
            with self._changed:
                self._members[connection] = amount
                self._changed.notify_all()
            _until_closed(reader)  # until the member goes away
            with self._changed:
                self._members.pop(connection, None)
                self._changed.notify_all()
            connection.close()
            return
        with self._changed:
            self._changed.wait_for(lambda: self.own + sum(self._members.values()) >= amount)
        connection.sendall(b"ok\n")
        with self._changed:
            self._changed.wait_for(lambda: self.own + sum(self._members.values()) < amount)
        connection.close()


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + JOIN_WAIT_S
    while True:
        try:
            return socket.create_connection((host, int(port)), timeout=5)
        except OSError as error:
            if time.monotonic() > deadline:
                print(f"cannot reach the head at {address}: {error}", file=sys.stderr, flush=True)
                os._exit(1)
            time.sleep(0.1)


def join(address: str, brings: int, what: str, on_lost: Callable[[], None] | None = None) -> None:
    """Join the head at ``address``; once joined, the process exits (code 1) when the head goes,
    or calls ``on_lost`` (in a thread of its own) where given."""
    connection = _connect(address)
    connection.settimeout(None)
    connection.sendall(f"join {brings}\n".encode())
    print(f"INFO: {what} joined the head at {address}", flush=True)

    def watch() -> None:
        _until_closed(connection.makefile("r"))
        print(f"ERROR: {what} lost the head at {address}", file=sys.stderr, flush=True)
        if on_lost is not None:
            on_lost()
            return
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def wait(address: str, needed: int, what: str) -> None:
    """Block until the cluster at ``address`` brings ``needed``; exit (code 1) once it brings less."""
    connection = _connect(address)
    connection.settimeout(None)
    connection.sendall(f"wait {needed}\n".encode())
    reader = connection.makefile("r")
    if reader.readline().strip() != "ok":
        print(f"ERROR: {what}: the cluster at {address} went away", file=sys.stderr, flush=True)
        os._exit(1)
    print(f"INFO: {what}: the cluster at {address} holds the {needed} it needs", flush=True)

    def watch() -> None:
        _until_closed(reader)
        print(f"ERROR: {what}: the cluster at {address} lost a member; exiting", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _until_closed(reader: TextIO) -> None:
    """Read until the peer closes the connection, or resets it (a process killed before reading all)."""
    try:
        reader.read()
    except OSError:
        pass


def visible_cards() -> int:
    """Cards this process was given (``CUDA_VISIBLE_DEVICES``), as Ray counts them."""
    return len([d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()])


def cluster_gpus(status: str) -> float | None:
    """The GPUs a real Ray cluster holds, from ``ray status``'s "Total Usage" (`` 0.0/2.0 GPU``);
    0 where it lists resources but no GPU; None where ``status`` is no such report."""
    usage = status.partition("Total Usage:")[2]
    if not usage:
        return None
    found = _TOTAL_GPUS.search(usage.partition("\n\n")[0])
    return float(found["total"]) if found else 0.0


def _real_gpus(ray: str, address: str) -> float | None:
    try:
        done = subprocess.run(
            [ray, "status", "--address", address], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return cluster_gpus(done.stdout) if done.returncode == 0 else None


def wait_real_ray(ray: str, address: str, needed: int, what: str) -> None:
    """Block until the real Ray cluster at ``address`` holds ``needed`` GPUs (asking ``ray``); exit
    (code 1) once it holds fewer, or once it no longer answers."""
    told: float | None = -1.0
    while (held := _real_gpus(ray, address)) is None or held < needed:
        if held != told:
            print(
                f"INFO: {what}: the Ray cluster at {address} holds {held or 0:g} of the {needed} GPU(s) "
                "it needs; waiting",
                flush=True,
            )
            told = held
        time.sleep(RAY_STATUS_EVERY_S)
    print(f"INFO: {what}: the Ray cluster at {address} holds the {needed} GPU(s) it needs", flush=True)

    def watch() -> None:
        failures = 0
        while True:
            time.sleep(RAY_STATUS_EVERY_S)
            held = _real_gpus(ray, address)
            failures = failures + 1 if held is None else 0
            if failures >= RAY_STATUS_FAILURES or (held is not None and held < needed):
                state = "no longer answers" if held is None else f"holds {held:g} GPU(s)"
                print(
                    f"ERROR: {what}: the Ray cluster at {address} {state}, {needed} needed; exiting",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
