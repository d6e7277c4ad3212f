"""A control plane starting itself again: a clean stop, then the same command in the same process.

::

    restart = SelfRestart()
    restart.request("llmgw restart")   # from the /api route; ControlPlane.run stops cleanly
    ...                                # after the stop: leadership handed off, requests finished
    start_again(listening_socket)      # execv the same command line; the socket carries over

The process re-executes itself (``execv``) rather than exiting for a
supervisor to start it again: it works the same under systemd, ``llmgw up``,
a test's process or a shell, and the supervisor never sees it go. Its HTTP
listening socket is kept open across the exec (its descriptor number is
passed in :data:`HTTP_FD_ENV`) and the new process serves on it, so a client
connecting meanwhile waits in the socket's backlog instead of being refused.

A control plane behind gateway workers hands no socket over: the workers
hold the port (``SO_REUSEPORT``). They keep running across the exec (they
are its children, and the pid stays), keep their copy of the gateway's state
and answer ``/v1`` from it while the plane is away, and connect again to the
new start's local channel. The plane hands their port and pids over in
:data:`WORKERS_ENV`; the new start binds that port, starts workers of its
own, and once they are connected and it serves ``/v1`` it stops the old ones
(SIGTERM: they finish their requests; ``workers.py``, :func:`retire`).

Each start of the process has an :data:`INSTANCE` of its own, which
``/healthz`` answers: a restart shows as a new instance (the pid stays).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

INSTANCE = secrets.token_hex(8)
"""This start of the process; a new one after every restart (the pid stays the same)."""

HTTP_FD_ENV = "LLMGW_HTTP_FD"
"""The environment variable naming the listening socket's descriptor across a restart."""
WORKERS_ENV = "LLMGW_WORKERS"
"""The environment variable naming the gateway workers' port and pids across a restart (``PORT:PID,PID``)."""


class SelfRestart:
    """A request for this control plane to start again, set by the /api route and awaited by its run."""

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.reason = ""

    def request(self, reason: str) -> None:
        if not self.requested.is_set():
            log.info("starting again: %s", reason)
            self.reason = reason
            self.requested.set()


def inherited_socket(host: str, port: int) -> socket.socket | None:
    """The listening socket a previous start of this process handed over, if it listens on
    ``host:port`` (port 0: any); the environment variable is removed either way."""
    named = os.environ.pop(HTTP_FD_ENV, "")
    if not named:
        return None
    try:
        sock = socket.socket(fileno=int(named))
    except (OSError, ValueError) as error:
        log.warning("the listening socket handed over (%s=%s) cannot be used: %s", HTTP_FD_ENV, named, error)
        return None
    bound_host, bound_port = sock.getsockname()[:2]
    if (port and bound_port != port) or (host not in ("0.0.0.0", "::", "") and bound_host != host):
        log.info(
            "the socket handed over listens on %s:%s, not %s:%s: binding anew",
            bound_host,
            bound_port,
            host,
            port,
        )
        sock.close()
        return None
    sock.setblocking(False)
    log.info("serving on the listening socket the previous start handed over (%s:%s)", bound_host, bound_port)
    return sock


def hand_over_workers(port: int, pids: Iterable[int]) -> None:
    """Leave the gateway workers (serving ``port``) running for the next start of this process."""
    os.environ[WORKERS_ENV] = f"{port}:{','.join(str(pid) for pid in sorted(pids))}"


def inherited_workers() -> tuple[int, list[int]] | None:
    """The port and pids of the gateway workers a previous start left running, if it did; the
    environment variable is removed either way."""
    named = os.environ.pop(WORKERS_ENV, "")
    if not named:
        return None
    try:
        port, _, pids = named.partition(":")
        return int(port), [int(pid) for pid in pids.split(",") if pid]
    except ValueError:
        log.warning("the gateway workers handed over (%s=%s) make no sense: ignored", WORKERS_ENV, named)
        return None


class Listening(Protocol):
    def fileno(self) -> int: ...


def hand_over(listening: Listening) -> None:
    """Keep ``listening`` open for the next start of this process (a duplicate survives the server's
    close and the exec)."""
    duplicate = os.dup(listening.fileno())
    os.set_inheritable(duplicate, True)
    os.environ[HTTP_FD_ENV] = str(duplicate)


def command_line() -> list[str]:
    """This process's own command line, as it was started (``python -m ...`` included)."""
    try:
        raw = Path("/proc/self/cmdline").read_bytes()
    except OSError:
        return [sys.executable, *sys.argv]
    return [part.decode() for part in raw.split(b"\0")[:-1]]


def start_again() -> None:
    """Replace this process with the same command (same pid)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, command_line())
