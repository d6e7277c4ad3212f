"""A throwaway PostgreSQL for tests, and a TCP proxy that can cut it off.

::

    with PostgresServer.start() as server:        # initdb + pg_ctl in a temp dir
        url = server.url                           # postgresql+asyncpg://postgres@127.0.0.1:PORT/postgres
        with StoreCut(server.port) as cut:         # clients use cut.url instead
            cut.cut()                               # connections hang, as behind a dead switch
            cut.restore()

The cluster runs as the ``postgres`` user when this process is root (initdb
refuses root), on a free loopback port, with its socket in its own folder;
``stop()`` and ``start_again()`` let fault tests take it away and bring it back.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from llmgw.errors import ConfigError

SEARCH = ["/usr/local/bin", *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
"""Where PostgreSQL's server binaries are looked for after $PATH."""

TEST_URL = os.environ.get("LLMGW_TEST_POSTGRES_URL", "")
"""A database the tests may wipe (``postgresql+asyncpg://user:pass@host:port/db``); empty: a throwaway one."""
LEFT_OUT = os.environ.get("LLMGW_TEST_POSTGRES", "1") == "0"
"""``LLMGW_TEST_POSTGRES=0``: the tests leave PostgreSQL out."""
BACKENDS = ["sqlite", "postgresql"]
"""The store matrices' halves, both always: where PostgreSQL cannot run, its half is a reported skip."""


def skip_unless_usable() -> None:
    """Skip the calling test (with its reason) where PostgreSQL is left out or cannot run here."""
    import pytest

    from llmgw.testing.components import skip_missing

    if LEFT_OUT:
        pytest.skip("LLMGW_TEST_POSTGRES=0 leaves PostgreSQL out")
    if not TEST_URL and not available():
        skip_missing("PostgreSQL's server binaries (initdb, pg_ctl)", "run 'make postgres'")


@contextlib.contextmanager
def session_database() -> Iterator[str]:
    """The URL of a PostgreSQL database for a test session: ``TEST_URL``, or a throwaway cluster's."""
    skip_unless_usable()
    if TEST_URL:
        yield TEST_URL
        return
    with postgres() as server:
        yield server.url


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def binary(name: str) -> str:
    """The path of a PostgreSQL server binary; ConfigError when it is not installed."""
    found = shutil.which(name)
    if found:
        return found
    for folder in SEARCH:
        candidate = Path(folder) / name
        if candidate.exists():
            return str(candidate)
    raise ConfigError(
        f"PostgreSQL's {name} is not installed",
        hint="run 'make install' (it installs them) or 'apt-get install -y postgresql'",
    )


def available() -> bool:
    """Whether a throwaway PostgreSQL can be started here."""
    try:
        binary("initdb")
        binary("pg_ctl")
    except ConfigError:
        return False
    return True


class PostgresServer:
    """One PostgreSQL cluster in a temporary folder, stopped and deleted on close."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder = folder
        self.port = port
        self.data = folder / "data"
        self._user = "postgres" if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    @classmethod
    def start(cls) -> PostgresServer:
        folder = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
        server = cls(folder, free_port())
        try:
            server._initdb()
            server.start_again()
        except BaseException:
            server.close()
            raise
        return server

    def _as_owner(self, *command: str) -> None:
        result = subprocess.run(
            list(command), user=self._user, capture_output=True, text=True, timeout=120, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {result.stdout}{result.stderr}")

    def _initdb(self) -> None:
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
        self._as_owner(
            binary("initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )

    def start_again(self) -> None:
        """Start (or restart after :meth:`stop`) the server and wait until it accepts connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._as_owner(
            binary("pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.folder / "log"),
            "-w",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: closes sessions; ``immediate``: like a crash)."""
        self._as_owner(binary("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class StoreCut:
    """A TCP proxy in front of a database that a test can cut and restore.

    Cut, it closes the connections it carries and accepts new ones without
    answering, like a network that swallows packets: a client learns of it
    only through its own timeouts.
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def url(self, database_url: str) -> str:
        """``database_url`` with its port replaced by this proxy's."""
        host, port = self._target
        return database_url.replace(f"{host}:{port}", f"127.0.0.1:{self.port}")

    def cut(self) -> None:
        self._open.clear()
        with self._lock:
            for sock in list(self._sockets):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def restore(self) -> None:
        self._open.set()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._track(client)
            if not self._open.is_set():
                continue  # held open, never answered
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._track(upstream)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while self._open.is_set():
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()

    def __enter__(self) -> StoreCut:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@contextlib.contextmanager
def postgres() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL for the block."""
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.close()
