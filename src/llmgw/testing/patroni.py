"""A throwaway Patroni cluster for tests: one etcd and PostgreSQL members, all on loopback.

::

    with PatroniCluster.start(members=2) as patroni:   # etcd + two Patroni members in a temp dir
        url = patroni.url                              # every member, target_session_attrs=read-write
        old = patroni.wait_primary()
        patroni.kill(old)                              # kill -9 its Patroni and its postmaster
        new = patroni.wait_primary(other_than=old)

Debian's ``etcd-server`` and ``patroni`` packages provide the programs (the
Makefile's ``patroni`` recipe installs them). PostgreSQL runs as the
``postgres`` user when this process is root, as in :mod:`llmgw.testing.postgres`.
Replication is synchronous (Patroni's ``synchronous_mode``), so a commit the
primary acknowledged is on the replica too: the failover Patroni documents
for losing no committed transaction.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from llmgw.errors import ConfigError
from llmgw.testing.eventually import eventually_sync
from llmgw.testing.postgres import binary, free_port

T = TypeVar("T")

TTL_S = 8
"""Patroni's leader key lives this long in etcd: a dead primary is replaced within it (plus a loop)."""
LOOP_WAIT_S = 1
RETRY_TIMEOUT_S = 3


def available() -> bool:
    """Whether etcd, Patroni and PostgreSQL's server binaries are installed here."""
    try:
        binary("initdb")
    except ConfigError:
        return False
    return shutil.which("etcd") is not None and shutil.which("patroni") is not None


@dataclass
class Member:
    """One PostgreSQL member under its own Patroni."""

    name: str
    folder: Path
    port: int = field(default_factory=free_port)
    api_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def role(self) -> str:
        """``primary``, ``replica`` (running and streaming) or "" (neither, or no answer)."""
        for role in ("primary", "replica"):
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/{role}", timeout=2) as answer:
                    if answer.status == 200:
                        return role
        return ""

    def postmaster_pid(self) -> int:
        """The postmaster's pid, from ``postmaster.pid`` (its first line)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])


class PatroniCluster:
    """etcd and ``members`` Patroni members in a temporary folder, stopped and deleted on close."""

    def __init__(self, folder: Path, members: int) -> None:
        self.folder = folder
        self.scope = "llmgw"
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.members = [Member(f"pg{i + 1}", folder / f"pg{i + 1}") for i in range(members)]
        self._user = "postgres" if os.geteuid() == 0 else None

    @classmethod
    def start(cls, members: int = 2, timeout_s: float = 120) -> PatroniCluster:
        cluster = cls(Path(tempfile.mkdtemp(prefix="llmgw-patroni-")), members)
        try:
            cluster._start_etcd()
            for member in cluster.members:
                cluster.start_member(member)
            cluster.wait_healthy(timeout_s)
        except BaseException:
            cluster.close()
            raise
        return cluster

    @property
    def url(self) -> str:
        """The store URL naming every member; asyncpg connects to whichever accepts writes."""
        hosts = "&".join(f"host={m.address}" for m in self.members)
        return f"postgresql+asyncpg://postgres@/postgres?{hosts}&target_session_attrs=read-write"

    def _start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        with (self.folder / "etcd.log").open("ab") as log:
            self.etcd = subprocess.Popen(
                [
                    "etcd",
                    "--name=etcd1",
                    f"--data-dir={self.folder / 'etcd'}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=etcd1={peer}",
                    "--initial-cluster-state=new",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        _wait(lambda: _answers(f"{client}/health"), 30, "etcd answers")

    def _config(self, member: Member) -> str:
        socket_dir = member.folder
        config = {
            "scope": self.scope,
            "name": member.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{member.api_port}",
                "connect_address": f"127.0.0.1:{member.api_port}",
            },
            "etcd3": {"hosts": f"127.0.0.1:{self.etcd_port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL_S,
                    "loop_wait": LOOP_WAIT_S,
                    "retry_timeout": RETRY_TIMEOUT_S,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "parameters": {"max_connections": 200, "fsync": "off", "wal_log_hints": "on"},
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": [
                    "local all all trust",
                    "host replication all 127.0.0.1/32 trust",
                    "host all all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": member.address,
                "connect_address": member.address,
                "data_dir": str(member.data),
                "bin_dir": str(Path(binary("pg_ctl")).resolve().parent),
                "pgpass": str(member.folder / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                },
                "parameters": {"unix_socket_directories": str(socket_dir)},
            },
        }
        return json.dumps(config)  # JSON is YAML

    def start_member(self, member: Member) -> None:
        """Start ``member``'s Patroni (again, after :meth:`kill`: it rejoins as a replica)."""
        member.folder.mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
            os.chown(member.folder, entry.pw_uid, entry.pw_gid)
        path = member.folder / "patroni.yml"
        path.write_text(self._config(member))
        with (member.folder / "patroni.log").open("ab") as log:
            member.process = subprocess.Popen(
                ["patroni", str(path)],
                user=self._user,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def primary(self) -> Member | None:
        return next((m for m in self.members if m.process is not None and m.role() == "primary"), None)

    def wait_primary(self, timeout_s: float = 60, other_than: Member | None = None) -> Member:
        """The member Patroni made primary (one other than ``other_than``), once there is one."""

        def found() -> Member | None:
            primary = self.primary()
            return primary if primary is not None and primary is not other_than else None

        primary = _wait(found, timeout_s, "a Patroni member is primary", self.logs)
        assert primary is not None
        return primary

    def wait_healthy(self, timeout_s: float = 120) -> Member:
        """Wait until one member is primary and every other one streams from it; the primary."""
        primary = self.wait_primary(timeout_s)
        for member in self.members:
            if member is not primary:
                _wait(partial(_is_replica, member), timeout_s, f"{member.name} replicates", self.logs)
        return primary

    def kill(self, member: Member) -> None:
        """kill -9 the member's Patroni and its postmaster, as when its machine dies."""
        pid = member.postmaster_pid()
        if member.process is not None:
            member.process.kill()
            member.process.wait(10)
            member.process = None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def kill_postmaster(self, member: Member) -> None:
        """kill -9 the member's postmaster alone: its Patroni starts it again (or fails over)."""
        os.kill(member.postmaster_pid(), signal.SIGKILL)

    def logs(self, lines: int = 20) -> str:
        out = []
        for member in self.members:
            path = member.folder / "patroni.log"
            if path.exists():
                out.append(
                    f"[{member.name}]\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
                )
        return "\n".join(out)

    def close(self) -> None:
        for member in self.members:
            if member.process is not None and member.process.poll() is None:
                member.process.terminate()
        for member in self.members:
            if member.process is not None:
                try:
                    member.process.wait(30)
                except subprocess.TimeoutExpired:
                    member.process.kill()
                    member.process.wait()
            with contextlib.suppress(OSError, ValueError, ProcessLookupError):
                os.kill(member.postmaster_pid(), signal.SIGKILL)
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PatroniCluster:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _is_replica(member: Member) -> bool:
    return member.role() == "replica"


def _answers(url: str) -> bool:
    with contextlib.suppress(OSError, urllib.error.URLError):
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    return False


def _wait(condition: Callable[[], T], timeout_s: float, what: str, logs: Callable[[], str] = str) -> T:
    """Poll ``condition`` until truthy; AssertionError naming ``what`` (and the logs) after ``timeout_s``."""
    try:
        return eventually_sync(condition, timeout_s=timeout_s, interval_s=0.2, message=what, ignoring=())
    except AssertionError as error:
        raise AssertionError(f"{error}\n{logs()}") from None
